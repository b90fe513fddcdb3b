/* template_lex.c - the Jinja lexer: source text to tokens, with jinja2's whitespace control
 * (-, +, trim_blocks, lstrip_blocks), comments and raw blocks. Pure function of its inputs;
 * any thread. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/template.h"

struct lexer {
    const char *s; /* normalized source */
    size_t n, pos;
    const struct tlex_opts *o;
    struct tarena *a;
    struct ttoken *toks;
    size_t n_toks, cap;
    /* position cache for line/column */
    size_t lc_off;
    int lc_line;
    size_t lc_line_start;
    struct kwk_err *err;
};

static void lex_linecol(struct lexer *L, size_t off, int *line, int *col)
{
    if (off < L->lc_off) {
        L->lc_off = 0;
        L->lc_line = 1;
        L->lc_line_start = 0;
    }
    for (size_t i = L->lc_off; i < off && i < L->n; i++) {
        if (L->s[i] == '\n') {
            L->lc_line++;
            L->lc_line_start = i + 1;
        }
    }
    L->lc_off = off;
    *line = L->lc_line;
    *col = (int)(off - L->lc_line_start) + 1;
}

static int lex_fail(struct lexer *L, size_t off, const char *msg)
{
    int line, col;
    lex_linecol(L, off, &line, &col);
    kwk_err_set_pos(L->err, KWK_ESYNTAX, (int64_t)off, "template syntax error at line %d, "
                    "column %d: %s", line, col, msg);
    if (L->err) {
        L->err->line = line;
        L->err->col = col;
    }
    return KWK_ESYNTAX;
}

static struct ttoken *lex_push(struct lexer *L, int type, size_t off, const char *p, size_t n)
{
    if (L->n_toks == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 64 + L->n / 8;
        struct ttoken *t = ta_alloc(L->a, cap * sizeof *t);
        if (!t)
            return NULL;
        if (L->n_toks)
            memcpy(t, L->toks, L->n_toks * sizeof *t);
        L->toks = t;
        L->cap = cap;
    }
    struct ttoken *t = &L->toks[L->n_toks++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->p = p;
    t->n = n;
    lex_linecol(L, off, &t->line, &t->col);
    return t;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static size_t skip_space(const char *s, size_t n, size_t i)
{
    while (i < n && is_space(s[i]))
        i++;
    return i;
}

/* Apply whitespace control to the text before a tag; sign is '-', '+' or 0. */
static size_t strip_text(struct lexer *L, size_t start, size_t end, char sign, int is_var)
{
    if (sign == '-') {
        while (end > start && is_space(L->s[end - 1]))
            end--;
        return end;
    }
    if (sign == '+' || !L->o->lstrip_blocks || is_var)
        return end;
    size_t l = end;
    while (l > start && L->s[l - 1] != '\n')
        l--;
    int line_starting = l > start || start == 0 || L->s[start - 1] == '\n';
    if (!line_starting || l == end)
        return end;
    for (size_t i = l; i < end; i++)
        if (!is_space(L->s[i]))
            return end;
    return l;
}

/* Match "{%[-+]?\s*NAME\s*(-%}|%}|+%})" at i; returns end offset (after trim) or 0. */
static size_t match_tag_word(struct lexer *L, size_t i, const char *word, char *sign_out,
                             int allow_trim)
{
    const char *s = L->s;
    size_t n = L->n, wl = strlen(word);
    if (i + 2 > n || s[i] != '{' || s[i + 1] != '%')
        return 0;
    i += 2;
    char sign = 0;
    if (i < n && (s[i] == '-' || s[i] == '+'))
        sign = s[i++];
    i = skip_space(s, n, i);
    if (i + wl > n || memcmp(s + i, word, wl) != 0)
        return 0;
    i += wl;
    i = skip_space(s, n, i);
    if (i + 3 <= n && s[i] == '-' && s[i + 1] == '%' && s[i + 2] == '}') {
        i = skip_space(s, n, i + 3);
    } else if (allow_trim && i + 3 <= n && s[i] == '+' && s[i + 1] == '%' && s[i + 2] == '}') {
        i += 3;
    } else if (i + 2 <= n && s[i] == '%' && s[i + 1] == '}') {
        i += 2;
        if (allow_trim && L->o->trim_blocks && i < n && s[i] == '\n')
            i++;
    } else {
        return 0;
    }
    if (sign_out)
        *sign_out = sign;
    return i;
}

/* Python unicode-escape decoding of a string literal body. */
static int lex_unescape(struct lexer *L, const char *p, size_t n, char **out, size_t *out_n)
{
    struct tbuf b;
    tb_init(&b, 0);
    uint32_t pending_hi = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\\' || i + 1 >= n) {
            tb_putc(&b, p[i]);
            continue;
        }
        char c = p[++i];
        uint32_t cp = 0;
        int digits = 0, got = 0;
        switch (c) {
        case '\n': continue;
        case '\\': tb_putc(&b, '\\'); continue;
        case '\'': tb_putc(&b, '\''); continue;
        case '"': tb_putc(&b, '"'); continue;
        case 'a': tb_putc(&b, '\a'); continue;
        case 'b': tb_putc(&b, '\b'); continue;
        case 'f': tb_putc(&b, '\f'); continue;
        case 'n': tb_putc(&b, '\n'); continue;
        case 'r': tb_putc(&b, '\r'); continue;
        case 't': tb_putc(&b, '\t'); continue;
        case 'v': tb_putc(&b, '\v'); continue;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (c >= '0' && c <= '7') {
                cp = (uint32_t)(c - '0');
                for (int k = 0; k < 2 && i + 1 < n && p[i + 1] >= '0' && p[i + 1] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(p[++i] - '0');
                tb_put_cp(&b, cp);
            } else {
                tb_putc(&b, '\\');
                tb_putc(&b, c);
            }
            continue;
        }
        for (; got < digits && i + 1 < n && kwk_hex_digit(p[i + 1]) >= 0; got++)
            cp = cp * 16 + (uint32_t)kwk_hex_digit(p[++i]);
        if (got != digits || cp > 0x10FFFF) {
            tb_free(&b);
            return -1;
        }
        if (cp >= 0xD800 && cp < 0xDC00) {
            pending_hi = cp;
            continue;
        }
        if (cp >= 0xDC00 && cp < 0xE000 && pending_hi) {
            cp = 0x10000 + ((pending_hi - 0xD800) << 10) + (cp - 0xDC00);
            pending_hi = 0;
        }
        tb_put_cp(&b, cp);
    }
    if (b.err) {
        tb_free(&b);
        return -1;
    }
    *out = ta_memdup(L->a, b.p ? b.p : "", b.n);
    *out_n = b.n;
    tb_free(&b);
    return *out ? 0 : -1;
}

static size_t lex_digits(const char *s, size_t n, size_t i)
{
    /* (\d+_)*\d+ */
    size_t start = i;
    while (i < n) {
        if (s[i] >= '0' && s[i] <= '9') {
            i++;
        } else if (s[i] == '_' && i > start && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '9') {
            i++;
        } else {
            break;
        }
    }
    return i;
}

static int lex_number(struct lexer *L, size_t i, size_t *end)
{
    const char *s = L->s;
    size_t n = L->n;
    size_t j = lex_digits(s, n, i);
    int is_float = 0;
    int after_dot = i > 0 && s[i - 1] == '.';
    if (!after_dot) {
        size_t k = j;
        if (k + 1 < n && s[k] == '.' && s[k + 1] >= '0' && s[k + 1] <= '9') {
            k = lex_digits(s, n, k + 1);
            is_float = 1;
        }
        if (k < n && (s[k] == 'e' || s[k] == 'E')) {
            size_t e = k + 1;
            if (e < n && (s[e] == '+' || s[e] == '-'))
                e++;
            if (e < n && s[e] >= '0' && s[e] <= '9') {
                k = lex_digits(s, n, e);
                is_float = 1;
            }
        }
        if (is_float)
            j = k;
    }
    char buf[128];
    size_t bn = 0;
    for (size_t k = i; k < j && bn + 1 < sizeof buf; k++)
        if (s[k] != '_')
            buf[bn++] = s[k];
    buf[bn] = 0;
    struct ttoken *t = lex_push(L, is_float ? TK_FLOAT : TK_INT, i, s + i, j - i);
    if (!t)
        return KWK_ELIMIT;
    if (is_float) {
        t->fval = strtod(buf, NULL);
    } else {
        errno = 0;
        long long v = strtoll(buf, NULL, 10);
        if (errno == ERANGE) {
            /* Python has big integers; the nearest we offer is a float. */
            t->type = TK_FLOAT;
            t->fval = strtod(buf, NULL);
        } else {
            t->ival = v;
        }
    }
    *end = j;
    return 0;
}

static const char *const lex_ops2[] = {"//", "**", "==", "!=", "<=", ">="};
static const char lex_ops1[] = "+-/*%~[](){}<>=.:|,;";

/* Tokens inside {{ }} or {% %} up to and including the end marker. */
static int lex_tag(struct lexer *L, int is_var)
{
    const char *s = L->s;
    size_t n = L->n, i = L->pos;
    char stack[256];
    size_t depth = 0;
    int rc;
    for (;;) {
        if (i >= n)
            return lex_fail(L, i, "unexpected end of template, tag not closed");
        if (depth == 0) {
            if (is_var) {
                if (i + 3 <= n && s[i] == '-' && s[i + 1] == '}' && s[i + 2] == '}') {
                    if (!lex_push(L, TK_VAR_END, i, s + i, 3))
                        return KWK_ELIMIT;
                    L->pos = skip_space(s, n, i + 3);
                    return 0;
                }
                if (i + 2 <= n && s[i] == '}' && s[i + 1] == '}') {
                    if (!lex_push(L, TK_VAR_END, i, s + i, 2))
                        return KWK_ELIMIT;
                    L->pos = i + 2;
                    return 0;
                }
            } else {
                if (i + 3 <= n && s[i] == '-' && s[i + 1] == '%' && s[i + 2] == '}') {
                    if (!lex_push(L, TK_BLOCK_END, i, s + i, 3))
                        return KWK_ELIMIT;
                    L->pos = skip_space(s, n, i + 3);
                    return 0;
                }
                if (i + 3 <= n && s[i] == '+' && s[i + 1] == '%' && s[i + 2] == '}') {
                    if (!lex_push(L, TK_BLOCK_END, i, s + i, 3))
                        return KWK_ELIMIT;
                    L->pos = i + 3;
                    return 0;
                }
                if (i + 2 <= n && s[i] == '%' && s[i + 1] == '}') {
                    if (!lex_push(L, TK_BLOCK_END, i, s + i, 2))
                        return KWK_ELIMIT;
                    i += 2;
                    if (L->o->trim_blocks && i < n && s[i] == '\n')
                        i++;
                    L->pos = i;
                    return 0;
                }
            }
        }
        char c = s[i];
        if (is_space(c)) {
            i++;
            continue;
        }
        if (c >= '0' && c <= '9') {
            if ((rc = lex_number(L, i, &i)))
                return rc;
            continue;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t j = i + 1;
            while (j < n && ((s[j] >= 'a' && s[j] <= 'z') || (s[j] >= 'A' && s[j] <= 'Z') ||
                             (s[j] >= '0' && s[j] <= '9') || s[j] == '_'))
                j++;
            if (!lex_push(L, TK_NAME, i, s + i, j - i))
                return KWK_ELIMIT;
            i = j;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != c) {
                if (s[j] == '\\')
                    j++;
                j++;
            }
            if (j >= n)
                return lex_fail(L, i, "unterminated string literal");
            char *val;
            size_t vn;
            if (lex_unescape(L, s + i + 1, j - i - 1, &val, &vn))
                return lex_fail(L, i, "bad escape in string literal");
            if (!lex_push(L, TK_STRING, i, val, vn))
                return KWK_ELIMIT;
            i = j + 1;
            continue;
        }
        size_t opn = 0;
        for (size_t k = 0; k < KWK_ARRAY_LEN(lex_ops2); k++)
            if (i + 2 <= n && !memcmp(s + i, lex_ops2[k], 2))
                opn = 2;
        if (!opn && strchr(lex_ops1, c) && c)
            opn = 1;
        if (!opn)
            return lex_fail(L, i, "unexpected character in tag");
        if (opn == 1 && (c == '(' || c == '[' || c == '{')) {
            if (depth == sizeof stack)
                return lex_fail(L, i, "brackets nested too deeply");
            stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (opn == 1 && (c == ')' || c == ']' || c == '}')) {
            if (!depth || stack[depth - 1] != c)
                return lex_fail(L, i, "unbalanced bracket");
            depth--;
        }
        if (!lex_push(L, TK_OP, i, s + i, opn))
            return KWK_ELIMIT;
        i += opn;
    }
}

/* Text then a raw block: {% raw %}...{% endraw %}. */
static int lex_raw(struct lexer *L, size_t body)
{
    const char *s = L->s;
    size_t n = L->n;
    for (size_t i = body; i + 1 < n; i++) {
        if (s[i] != '{' || s[i + 1] != '%')
            continue;
        char sign = 0;
        size_t end = match_tag_word(L, i, "endraw", &sign, 1);
        if (!end)
            continue;
        size_t text_end = strip_text(L, body, i, sign, 0);
        if (text_end > body && !lex_push(L, TK_DATA, body, s + body, text_end - body))
            return KWK_ELIMIT;
        L->pos = end;
        return 0;
    }
    return lex_fail(L, body, "missing end of raw directive");
}

static int lex_root(struct lexer *L)
{
    const char *s = L->s;
    size_t n = L->n;
    int rc;
    while (L->pos < n) {
        size_t start = L->pos, i = start;
        while (i + 1 < n && !(s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' ||
                                               s[i + 1] == '#')))
            i++;
        if (i + 1 >= n) {
            if (!lex_push(L, TK_DATA, start, s + start, n - start))
                return KWK_ELIMIT;
            L->pos = n;
            return 0;
        }
        char kind = s[i + 1];
        char sign = (i + 2 < n && (s[i + 2] == '-' || s[i + 2] == '+')) ? s[i + 2] : 0;
        size_t text_end = strip_text(L, start, i, sign, kind == '{');
        if (text_end > start && !lex_push(L, TK_DATA, start, s + start, text_end - start))
            return KWK_ELIMIT;
        size_t after = i + 2 + (sign ? 1 : 0);
        if (kind == '%') {
            size_t raw_end = match_tag_word(L, i, "raw", NULL, 0);
            if (raw_end) {
                if ((rc = lex_raw(L, raw_end)))
                    return rc;
                continue;
            }
        }
        if (kind == '#') {
            size_t j = after;
            while (j + 1 < n && !(s[j] == '#' && s[j + 1] == '}'))
                j++;
            if (j + 1 >= n)
                return lex_fail(L, i, "missing end of comment tag");
            size_t e = j + 2;
            if (j > after && s[j - 1] == '-') {
                e = skip_space(s, n, e);
            } else if (j > after && s[j - 1] == '+') {
                /* keep the newline */
            } else if (L->o->trim_blocks && e < n && s[e] == '\n') {
                e++;
            }
            L->pos = e;
            continue;
        }
        if (!lex_push(L, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, i, s + i, after - i))
            return KWK_ELIMIT;
        L->pos = after;
        if ((rc = lex_tag(L, kind == '{')))
            return rc;
    }
    return 0;
}

int tpl_lex(const char *src, size_t len, const struct tlex_opts *o, struct tarena *a,
            struct ttoken **toks, size_t *n_toks, struct kwk_err *err)
{
    /* jinja2 turns \r\n and \r into \n and drops one trailing newline (keep_trailing_newline
     * is off in transformers). */
    char *s = ta_alloc(a, len + 1);
    if (!s)
        return kwk_err_set(err, KWK_ELIMIT, "template too large");
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    struct lexer L = {.s = s, .n = n, .o = o, .a = a, .err = err, .lc_line = 1};
    int rc = lex_root(&L);
    if (rc == KWK_ELIMIT && (!err || !err->code))
        kwk_err_set(err, KWK_ELIMIT, "template too large");
    if (rc)
        return rc;
    if (!lex_push(&L, TK_EOF, n, s + n, 0))
        return kwk_err_set(err, KWK_ELIMIT, "template too large");
    *toks = L.toks;
    *n_toks = L.n_toks;
    return 0;
}
