/* schema_text.c - the converter's text buffer and GBNF literals. One conversion's thread. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "grammar/schema.h"

static int sb_reserve(struct sbuf *b, size_t extra)
{
    size_t need;
    if (b->err)
        return -1;
    if (kwk_add_size(b->n, extra, &need) || kwk_add_size(need, 1, &need) ||
        need > (size_t)KWK_GRAMMAR_TEXT_MAX + 1) {
        b->err = KWK_ELIMIT;
        return -1;
    }
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap *= 2;
    char *p = kwk_realloc(b->p, cap);
    if (!p) {
        b->err = -ENOMEM;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void sb_put(struct sbuf *b, const char *s, size_t n)
{
    if (sb_reserve(b, n))
        return;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void sb_puts(struct sbuf *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->err = b->err ? b->err : KWK_EARG;
        return;
    }
    if ((size_t)n < sizeof small) {
        sb_put(b, small, (size_t)n);
        return;
    }
    if (sb_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

char *sb_take(struct sbuf *b, int *rc)
{
    if (!b->err && sb_reserve(b, 0) == 0 && b->p) {
        char *p = b->p;
        p[b->n] = 0;
        b->p = NULL;
        b->n = b->cap = 0;
        return p;
    }
    if (!b->err)
        b->err = -ENOMEM;
    *rc = b->err;
    sb_free(b);
    return NULL;
}

void sb_free(struct sbuf *b)
{
    kwk_free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

void sb_literal(struct sbuf *b, const char *s, size_t n)
{
    sb_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        switch (ch) {
        case '"': sb_puts(b, "\\\""); break;
        case '\\': sb_puts(b, "\\\\"); break;
        case '\n': sb_puts(b, "\\n"); break;
        case '\r': sb_puts(b, "\\r"); break;
        case '\t': sb_puts(b, "\\t"); break;
        default:
            if (ch < 0x20 || ch == 0x7f)
                sb_printf(b, "\\x%02X", ch);
            else
                sb_put(b, (const char *)&ch, 1);
        }
    }
    sb_put(b, "\"", 1);
}
