/* template_json.c - the tojson filter exactly as transformers defines it: Python's json.dumps
 * with ensure_ascii, indent, separators and sort_keys, keeping dict insertion order. One render
 * per thread. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/template.h"

static void json_str(struct tbuf *b, const char *p, size_t n, int ensure_ascii)
{
    tb_putc(b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        const char *esc = NULL;
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default: break;
        }
        if (!esc && c >= 0x20 && (c < 0x80 || !ensure_ascii)) {
            i++;
            run++;
            continue;
        }
        tb_put(b, p + i - run, run);
        run = 0;
        if (esc) {
            tb_puts(b, esc);
            i++;
        } else if (c < 0x20) {
            tb_printf(b, "\\u%04x", c);
            i++;
        } else {
            size_t l;
            uint32_t cp = tu_decode(p + i, n - i, &l);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                tb_printf(b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                tb_printf(b, "\\u%04x", cp);
            }
            i += l;
        }
    }
    tb_put(b, p + n - run, run);
    tb_putc(b, '"');
}

static void newline_indent(struct tbuf *b, const struct tjson_opts *o, int level)
{
    tb_putc(b, '\n');
    for (int i = 0; i < level; i++)
        tb_put(b, o->indent, o->indent_n);
}

/* Keys as json.dumps turns them into strings. */
static int key_text(struct trender *r, const struct tnode *at, const struct tv *k, struct tbuf *b,
                    int ensure_ascii)
{
    char num[64];
    switch (k->k) {
    case TV_STR: json_str(b, k->u.s.p, k->u.s.n, ensure_ascii); return 0;
    case TV_NONE: tb_puts(b, "\"null\""); return 0;
    case TV_BOOL: tb_puts(b, k->u.b ? "\"true\"" : "\"false\""); return 0;
    case TV_INT: tb_printf(b, "\"%lld\"", (long long)k->u.i); return 0;
    case TV_FLOAT:
        tv_float_repr(k->u.f, num, sizeof num);
        tb_printf(b, "\"%s\"", num);
        return 0;
    default:
        return tpl_fail(r, KWK_ERUNTIME, at, "keys must be str, int, float, bool or None, not %s",
                        tv_type_name(k));
    }
}

static int cmp_keys(const void *x, const void *y)
{
    const struct tv *a = *(const struct tv *const *)x, *b = *(const struct tv *const *)y;
    size_t n = KWK_MIN(a->u.s.n, b->u.s.n);
    int c = memcmp(a->u.s.p, b->u.s.p, n);
    if (c)
        return c;
    return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
}

static int dump(struct trender *r, const struct tnode *at, struct tbuf *b, const struct tv *v,
                const struct tjson_opts *o, int level)
{
    char num[64];
    int rc;
    if (level > 200)
        return tpl_fail(r, KWK_ELIMIT, at, "tojson: value nests too deeply");
    if ((rc = tpl_step(r, at)))
        return rc;
    switch (v->k) {
    case TV_NONE: tb_puts(b, "null"); return 0;
    case TV_UNDEF:
        if (r->dialect == TD_HFJS) {
            tb_puts(b, "null");
            return 0;
        }
        return tpl_fail(r, KWK_ERUNTIME, at, "Object of type Undefined is not JSON serializable");
    case TV_BOOL: tb_puts(b, v->u.b ? "true" : "false"); return 0;
    case TV_INT: tb_printf(b, "%lld", (long long)v->u.i); return 0;
    case TV_FLOAT:
        if (isnan(v->u.f))
            tb_puts(b, "NaN");
        else if (isinf(v->u.f))
            tb_puts(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else {
            tv_float_repr(v->u.f, num, sizeof num);
            tb_puts(b, num);
        }
        return 0;
    case TV_STR: json_str(b, v->u.s.p, v->u.s.n, o->ensure_ascii); return 0;
    case TV_LIST: {
        const struct tlist *l = v->u.l;
        if (v->flag & (TVF_RANGE | TVF_GEN))
            return tpl_fail(r, KWK_ERUNTIME, at, "Object of type %s is not JSON serializable",
                            v->flag & TVF_RANGE ? "range" : "generator");
        if (!l->n) {
            tb_puts(b, "[]");
            return 0;
        }
        tb_putc(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                tb_puts(b, o->item_sep);
            if (o->indent)
                newline_indent(b, o, level + 1);
            if ((rc = dump(r, at, b, &l->v[i], o, level + 1)))
                return rc;
        }
        if (o->indent)
            newline_indent(b, o, level);
        tb_putc(b, ']');
        return 0;
    }
    case TV_DICT: {
        const struct tdict *d = v->u.d;
        if (!d->n) {
            tb_puts(b, "{}");
            return 0;
        }
        size_t *order = NULL;
        if (o->sort_keys && d->n > 1) {
            /* json.dumps sorts the keys themselves; string keys are what templates have. */
            const struct tv **ks = ta_alloc(r->a, d->n * sizeof *ks);
            order = ta_alloc(r->a, d->n * sizeof *order);
            if (!ks || !order)
                return tpl_fail(r, KWK_ELIMIT, at, "template render ran out of memory");
            for (size_t i = 0; i < d->n; i++) {
                if (d->keys[i].k != TV_STR)
                    return tpl_fail(r, KWK_ERUNTIME, at, "tojson: sort_keys needs string keys");
                ks[i] = &d->keys[i];
            }
            qsort(ks, d->n, sizeof *ks, cmp_keys);
            for (size_t i = 0; i < d->n; i++)
                order[i] = (size_t)(ks[i] - d->keys);
        }
        tb_putc(b, '{');
        for (size_t j = 0; j < d->n; j++) {
            size_t i = order ? order[j] : j;
            if (j)
                tb_puts(b, o->item_sep);
            if (o->indent)
                newline_indent(b, o, level + 1);
            if ((rc = key_text(r, at, &d->keys[i], b, o->ensure_ascii)))
                return rc;
            tb_puts(b, o->key_sep);
            if ((rc = dump(r, at, b, &d->vals[i], o, level + 1)))
                return rc;
        }
        if (o->indent)
            newline_indent(b, o, level);
        tb_putc(b, '}');
        return 0;
    }
    default:
        return tpl_fail(r, KWK_ERUNTIME, at, "Object of type %s is not JSON serializable",
                        tv_type_name(v));
    }
}

int tpl_tojson(struct trender *r, const struct tnode *at, struct tbuf *b, const struct tv *v,
               const struct tjson_opts *o)
{
    int rc = dump(r, at, b, v, o, 0);
    if (!rc && b->err)
        rc = tpl_fail(r, KWK_ELIMIT, at, "tojson: output exceeds the size limit");
    return rc;
}

/* ---- JSON in: the render context, straight into values (no intermediate tree). Accepts what
 * Python's json.dumps writes, including NaN / Infinity and NUL characters in keys. ---- */

struct jparser {
    struct trender *r;
    const char *p, *end, *start;
    int depth;
};

static int jfail(struct jparser *J, const char *what)
{
    return tpl_fail(J->r, KWK_EFORMAT, NULL, "context JSON: %s at byte %zu", what,
                    (size_t)(J->p - J->start));
}

static void jspace(struct jparser *J)
{
    while (J->p < J->end && (*J->p == ' ' || *J->p == '\t' || *J->p == '\n' || *J->p == '\r'))
        J->p++;
}

static int jlit(struct jparser *J, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(J->end - J->p) >= n && !memcmp(J->p, lit, n)) {
        J->p += n;
        return 1;
    }
    return 0;
}

static int jhex4(const char *p, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 0;
}

static int jstring(struct jparser *J, struct tv *out)
{
    const char *s = ++J->p; /* past the quote */
    const char *q = memchr(s, '"', (size_t)(J->end - s));
    const char *bs = q ? memchr(s, '\\', (size_t)(q - s)) : NULL;
    int plain = q != NULL && bs == NULL;
    for (const char *c = s; plain && c < q; c++)
        plain = (unsigned char)*c >= 0x20;
    if (!plain) {
        q = s;
        while (q < J->end && *q != '"' && *q != '\\')
            q++;
    }
    if (q && q < J->end && *q == '"') {
        /* no escapes: a view into the caller's JSON, which outlives the render */
        J->p = q + 1;
        *out = tv_str(s, (size_t)(q - s));
        return 0;
    }
    struct tbuf b;
    tb_init(&b, 0);
    tb_put(&b, s, (size_t)(q - s));
    J->p = q;
    while (J->p < J->end && *J->p != '"') {
        char c = *J->p;
        if ((unsigned char)c < 0x20) {
            tb_free(&b);
            return jfail(J, "control character in string");
        }
        if (c != '\\') {
            const char *run = J->p;
            while (J->p < J->end && *J->p != '"' && *J->p != '\\' && (unsigned char)*J->p >= 0x20)
                J->p++;
            tb_put(&b, run, (size_t)(J->p - run));
            continue;
        }
        if (J->end - J->p < 2)
            break;
        char e = J->p[1];
        J->p += 2;
        switch (e) {
        case '"': tb_putc(&b, '"'); break;
        case '\\': tb_putc(&b, '\\'); break;
        case '/': tb_putc(&b, '/'); break;
        case 'b': tb_putc(&b, '\b'); break;
        case 'f': tb_putc(&b, '\f'); break;
        case 'n': tb_putc(&b, '\n'); break;
        case 'r': tb_putc(&b, '\r'); break;
        case 't': tb_putc(&b, '\t'); break;
        case 'u': {
            uint32_t cp, lo;
            if (J->end - J->p < 4 || jhex4(J->p, &cp)) {
                tb_free(&b);
                return jfail(J, "bad \\u escape");
            }
            J->p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && J->end - J->p >= 6 && J->p[0] == '\\' &&
                J->p[1] == 'u' && !jhex4(J->p + 2, &lo) && lo >= 0xDC00 && lo < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                J->p += 6;
            }
            tb_put_cp(&b, cp);
            break;
        }
        default: tb_free(&b); return jfail(J, "bad escape");
        }
    }
    if (J->p >= J->end) {
        tb_free(&b);
        return jfail(J, "unterminated string");
    }
    J->p++;
    if (b.err) {
        tb_free(&b);
        return tpl_fail(J->r, KWK_ELIMIT, NULL, "context JSON: out of memory");
    }
    int rc = tv_str_copy(J->r, b.p ? b.p : "", b.n, out);
    tb_free(&b);
    return rc;
}

static int jnumber(struct jparser *J, struct tv *out)
{
    const char *s = J->p;
    int is_float = 0;
    if (J->p < J->end && *J->p == '-')
        J->p++;
    if (jlit(J, "Infinity")) {
        *out = tv_float(s[0] == '-' ? -INFINITY : INFINITY);
        return 0;
    }
    while (J->p < J->end && ((*J->p >= '0' && *J->p <= '9') || *J->p == '.' || *J->p == 'e' ||
                             *J->p == 'E' || *J->p == '+' || *J->p == '-')) {
        if (*J->p == '.' || *J->p == 'e' || *J->p == 'E')
            is_float = 1;
        J->p++;
    }
    char buf[400];
    size_t n = (size_t)(J->p - s);
    if (!n || n >= sizeof buf)
        return jfail(J, "bad number");
    memcpy(buf, s, n);
    buf[n] = 0;
    char *end;
    if (!is_float) {
        errno = 0;
        long long v = strtoll(buf, &end, 10);
        if (*end == 0 && errno != ERANGE) {
            *out = tv_int(v);
            return 0;
        }
    }
    double d = strtod(buf, &end);
    if (*end)
        return jfail(J, "bad number");
    *out = tv_float(d);
    return 0;
}

static int jvalue(struct jparser *J, struct tv *out)
{
    int rc;
    jspace(J);
    if (J->p >= J->end)
        return jfail(J, "unexpected end");
    if (++J->depth > 256)
        return tpl_fail(J->r, KWK_ELIMIT, NULL, "context JSON nests too deeply");
    char c = *J->p;
    if (c == '"') {
        rc = jstring(J, out);
    } else if (c == '{' || c == '[') {
        int obj = c == '{';
        J->p++;
        rc = obj ? tv_new_dict(J->r, 0, out) : tv_new_list(J->r, 0, out);
        jspace(J);
        if (!rc && J->p < J->end && *J->p == (obj ? '}' : ']')) {
            J->p++;
        } else {
            while (!rc) {
                struct tv k, v;
                jspace(J);
                if (obj) {
                    if (J->p >= J->end || *J->p != '"') {
                        rc = jfail(J, "expected a key");
                        break;
                    }
                    if ((rc = jstring(J, &k)))
                        break;
                    jspace(J);
                    if (J->p >= J->end || *J->p != ':') {
                        rc = jfail(J, "expected ':'");
                        break;
                    }
                    J->p++;
                }
                if ((rc = jvalue(J, &v)))
                    break;
                /* duplicate keys: the last wins, as in Python */
                rc = obj ? td_set(J->r, out->u.d, k, v) : tl_push(J->r, out->u.l, v);
                if (rc)
                    break;
                jspace(J);
                if (J->p < J->end && *J->p == ',') {
                    J->p++;
                    continue;
                }
                if (J->p < J->end && *J->p == (obj ? '}' : ']')) {
                    J->p++;
                    break;
                }
                rc = jfail(J, obj ? "expected ',' or '}'" : "expected ',' or ']'");
            }
        }
    } else if (jlit(J, "true")) {
        *out = tv_bool(1);
        rc = 0;
    } else if (jlit(J, "false")) {
        *out = tv_bool(0);
        rc = 0;
    } else if (jlit(J, "null")) {
        *out = tv_none();
        rc = 0;
    } else if (jlit(J, "NaN")) {
        *out = tv_float(NAN);
        rc = 0;
    } else if (c == '-' || c == 'I' || (c >= '0' && c <= '9')) {
        rc = jnumber(J, out);
    } else {
        rc = jfail(J, "unexpected character");
    }
    J->depth--;
    return rc;
}

int tpl_json_parse(struct trender *r, const char *p, size_t n, struct tv *out)
{
    struct jparser J = {.r = r, .p = p, .end = p + n, .start = p};
    int rc = jvalue(&J, out);
    if (rc)
        return rc;
    jspace(&J);
    if (J.p != J.end)
        return jfail(&J, "trailing characters");
    return 0;
}
