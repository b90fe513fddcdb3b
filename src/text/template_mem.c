/* template_mem.c - the template engine's arena, growable buffer and UTF-8 helpers. Each object
 * belongs to one render or one template; any thread may call these on objects it owns. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "text/template.h"

struct ta_chunk {
    struct ta_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

#define TA_CHUNK_MIN ((size_t)64 * 1024 - 64)

void ta_init(struct tarena *a, size_t limit)
{
    a->head = NULL;
    a->total = 0;
    a->limit = limit;
}

void ta_free(struct tarena *a)
{
    struct ta_chunk *c = a->head;
    while (c) {
        struct ta_chunk *next = c->next;
        kwk_free(c);
        c = next;
    }
    a->head = NULL;
    a->total = 0;
}

void *ta_alloc(struct tarena *a, size_t n)
{
    size_t need = (n + 15) & ~(size_t)15;
    if (need < n)
        return NULL;
    struct ta_chunk *c = a->head;
    if (!c || c->cap - c->used < need) {
        /* Fixed-size chunks stay under malloc's mmap threshold, so renders reuse heap memory
         * instead of faulting in fresh pages; only oversized requests get their own chunk. */
        size_t cap = need > TA_CHUNK_MIN ? need : TA_CHUNK_MIN;
        size_t bytes;
        if (kwk_add_size(sizeof(struct ta_chunk), cap, &bytes))
            return NULL;
        if (a->limit && (a->total + bytes > a->limit || a->total + bytes < a->total))
            return NULL;
        c = kwk_malloc(bytes);
        if (!c)
            return NULL;
        c->used = 0;
        c->cap = cap;
        c->next = a->head;
        a->head = c;
        a->total += bytes;
    }
    void *p = c->data + c->used;
    c->used += need;
    memset(p, 0, n);
    return p;
}

char *ta_memdup(struct tarena *a, const char *p, size_t n)
{
    if (n == SIZE_MAX)
        return NULL;
    char *q = ta_alloc(a, n + 1);
    if (!q)
        return NULL;
    if (n)
        memcpy(q, p, n);
    q[n] = 0;
    return q;
}

void tb_init(struct tbuf *b, size_t limit)
{
    b->p = NULL;
    b->n = b->cap = 0;
    b->limit = limit;
    b->err = 0;
}

void tb_free(struct tbuf *b)
{
    kwk_free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

static int tb_reserve(struct tbuf *b, size_t extra)
{
    size_t need;
    if (b->err)
        return -1;
    if (kwk_add_size(b->n, extra, &need) || need == SIZE_MAX ||
        (b->limit && need > b->limit)) {
        b->err = KWK_ELIMIT;
        return -1;
    }
    if (need + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need + 1) {
        if (cap > SIZE_MAX / 2) {
            cap = need + 1;
            break;
        }
        cap *= 2;
    }
    char *p = kwk_realloc(b->p, cap);
    if (!p) {
        b->err = -ENOMEM;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void tb_put(struct tbuf *b, const char *p, size_t n)
{
    if (!n || tb_reserve(b, n))
        return;
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

void tb_putc(struct tbuf *b, char c)
{
    tb_put(b, &c, 1);
}

void tb_puts(struct tbuf *b, const char *s)
{
    tb_put(b, s, strlen(s));
}

void tb_printf(struct tbuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        tb_put(b, tmp, (size_t)n);
        return;
    }
    if (tb_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

void tb_put_cp(struct tbuf *b, uint32_t cp)
{
    char s[4];
    size_t n;
    if (cp < 0x80) {
        s[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        s[0] = (char)(0xC0 | (cp >> 6));
        s[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        s[0] = (char)(0xE0 | (cp >> 12));
        s[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        s[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        s[0] = (char)(0xF0 | (cp >> 18));
        s[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        s[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        s[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    tb_put(b, s, n);
}

uint32_t tu_decode(const char *p, size_t n, size_t *len)
{
    const unsigned char *s = (const unsigned char *)p;
    unsigned c = s[0];
    size_t need;
    uint32_t cp;
    if (c < 0x80) {
        *len = 1;
        return c;
    } else if ((c & 0xE0) == 0xC0) {
        need = 2;
        cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        need = 3;
        cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        need = 4;
        cp = c & 0x07;
    } else {
        *len = 1;
        return c;
    }
    if (need > n) {
        *len = 1;
        return c;
    }
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *len = 1;
            return c;
        }
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    *len = need;
    return cp;
}

size_t tu_count(const char *p, size_t n)
{
    tpl_work += n / 64;
    size_t count = 0, i = 0;
    while (i < n) {
        size_t l;
        if ((unsigned char)p[i] < 0x80) {
            i++;
        } else {
            tu_decode(p + i, n - i, &l);
            i += l;
        }
        count++;
    }
    return count;
}

size_t tu_offset(const char *p, size_t n, size_t idx)
{
    tpl_work += idx / 64;
    size_t i = 0;
    while (idx > 0 && i < n) {
        size_t l;
        tu_decode(p + i, n - i, &l);
        i += l;
        idx--;
    }
    return i;
}
