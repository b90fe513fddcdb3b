/* template_value.c - template values with Python semantics: construction, truthiness, equality,
 * ordering, str()/repr() printing, length, iteration and conversion from JSON. Values live in
 * the render's arena; one render is driven by one thread. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/template.h"

static int oom(struct trender *r)
{
    return tpl_fail(r, KWK_ELIMIT, NULL, "template render ran out of its memory limit");
}

int tv_new_list(struct trender *r, size_t cap, struct tv *out)
{
    struct tlist *l = ta_alloc(r->a, sizeof *l);
    if (!l)
        return oom(r);
    if (cap) {
        size_t bytes;
        if (kwk_mul_size(cap, sizeof(struct tv), &bytes) || !(l->v = ta_alloc(r->a, bytes)))
            return oom(r);
        l->cap = cap;
    }
    memset(out, 0, sizeof *out);
    out->k = TV_LIST;
    out->u.l = l;
    return 0;
}

int tv_new_dict(struct trender *r, size_t cap, struct tv *out)
{
    struct tdict *d = ta_alloc(r->a, sizeof *d);
    if (!d)
        return oom(r);
    if (cap) {
        size_t bytes;
        if (kwk_mul_size(cap, sizeof(struct tv), &bytes) || !(d->keys = ta_alloc(r->a, bytes)) ||
            !(d->vals = ta_alloc(r->a, bytes)))
            return oom(r);
        d->cap = cap;
    }
    memset(out, 0, sizeof *out);
    out->k = TV_DICT;
    out->u.d = d;
    return 0;
}

static int grow(struct trender *r, struct tv **v, size_t n, size_t *cap)
{
    size_t nc = *cap ? *cap * 2 : 4, bytes;
    if (kwk_mul_size(nc, sizeof(struct tv), &bytes))
        return oom(r);
    struct tv *nv = ta_alloc(r->a, bytes);
    if (!nv)
        return oom(r);
    if (n)
        memcpy(nv, *v, n * sizeof *nv);
    *v = nv;
    *cap = nc;
    return 0;
}

int tl_push(struct trender *r, struct tlist *l, struct tv v)
{
    if (l->n == l->cap && grow(r, &l->v, l->n, &l->cap))
        return r->err ? r->err->code : KWK_ELIMIT;
    l->v[l->n++] = v;
    return 0;
}

static int key_eq(const struct tv *a, const struct tv *b)
{
    if (a->k == TV_STR && b->k == TV_STR)
        return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    return tv_eq(a, b);
}

struct tv *td_get(const struct tdict *d, struct tv key)
{
    tpl_work += d->n / 4;
    for (size_t i = 0; i < d->n; i++)
        if (key_eq(&d->keys[i], &key))
            return &d->vals[i];
    return NULL;
}

struct tv *td_get_str(const struct tdict *d, const char *p, size_t n)
{
    tpl_work += d->n / 4;
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].k == TV_STR && d->keys[i].u.s.n == n && !memcmp(d->keys[i].u.s.p, p, n))
            return &d->vals[i];
    return NULL;
}

int td_set(struct trender *r, struct tdict *d, struct tv key, struct tv val)
{
    struct tv *slot = td_get(d, key);
    if (slot) {
        *slot = val;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap, n = d->n;
        if (grow(r, &d->keys, n, &cap))
            return KWK_ELIMIT;
        cap = d->cap;
        if (grow(r, &d->vals, n, &cap))
            return KWK_ELIMIT;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = val;
    d->n++;
    return 0;
}

int tv_str_copy(struct trender *r, const char *p, size_t n, struct tv *out)
{
    char *s = ta_memdup(r->a, p, n);
    if (!s)
        return oom(r);
    *out = tv_str(s, n);
    return 0;
}

int tv_from_buf(struct trender *r, struct tbuf *b, struct tv *out)
{
    if (b->err) {
        int code = b->err;
        tb_free(b);
        return tpl_fail(r, code == KWK_ELIMIT ? KWK_ELIMIT : code, NULL,
                        "template output exceeds its size limit");
    }
    int rc = tv_str_copy(r, b->p ? b->p : "", b->n, out);
    tb_free(b);
    return rc;
}

int tv_truthy(const struct tv *v)
{
    switch (v->k) {
    case TV_UNDEF:
    case TV_NONE: return 0;
    case TV_BOOL: return v->u.b;
    case TV_INT: return v->u.i != 0;
    case TV_FLOAT: return v->u.f != 0.0;
    case TV_STR: return v->u.s.n != 0;
    case TV_LIST: return v->u.l->n != 0 || (v->flag & TVF_GEN);
    case TV_DICT: return v->u.d->n != 0;
    default: return 1;
    }
}

int tv_is_num(const struct tv *v)
{
    return v->k == TV_BOOL || v->k == TV_INT || v->k == TV_FLOAT;
}

double tv_num(const struct tv *v)
{
    return v->k == TV_FLOAT ? v->u.f : v->k == TV_INT ? (double)v->u.i : (double)v->u.b;
}

static int64_t tv_as_i(const struct tv *v)
{
    return v->k == TV_INT ? v->u.i : v->u.b;
}

int tv_eq(const struct tv *a, const struct tv *b)
{
    tpl_work++;
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a->k != TV_FLOAT && b->k != TV_FLOAT)
            return tv_as_i(a) == tv_as_i(b);
        return tv_num(a) == tv_num(b);
    }
    if (a->k != b->k)
        return 0;
    switch (a->k) {
    case TV_UNDEF:
    case TV_NONE: return 1;
    case TV_STR: return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    case TV_LIST:
        if ((a->flag & TVF_TUPLE) != (b->flag & TVF_TUPLE) || a->u.l->n != b->u.l->n)
            return 0;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!tv_eq(&a->u.l->v[i], &b->u.l->v[i]))
                return 0;
        return 1;
    case TV_DICT:
    case TV_NS:
        if (a->u.d == b->u.d)
            return 1;
        if (a->k == TV_NS || a->u.d->n != b->u.d->n)
            return 0;
        for (size_t i = 0; i < a->u.d->n; i++) {
            struct tv *o = td_get(b->u.d, a->u.d->keys[i]);
            if (!o || !tv_eq(&a->u.d->vals[i], o))
                return 0;
        }
        return 1;
    case TV_BUILTIN: return a->id == b->id;
    default: return a->u.m == b->u.m;
    }
}

const char *tv_type_name(const struct tv *v)
{
    switch (v->k) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return "str";
    case TV_LIST:
        return v->flag & TVF_GEN ? "generator" : v->flag & TVF_RANGE ? "range"
               : v->flag & TVF_TUPLE ? "tuple" : "list";
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    case TV_MACRO: return "Macro";
    case TV_LOOP: return "LoopContext";
    default: return "function";
    }
}

/* Compare two strings by code point (UTF-8 byte order is code point order). */
static int str_cmp(const struct tv *a, const struct tv *b)
{
    size_t n = KWK_MIN(a->u.s.n, b->u.s.n);
    int c = memcmp(a->u.s.p, b->u.s.p, n);
    if (c)
        return c;
    return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
}

int tv_cmp(struct trender *r, const struct tnode *at, const struct tv *a, const struct tv *b,
           int *res)
{
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a->k != TV_FLOAT && b->k != TV_FLOAT) {
            int64_t x = tv_as_i(a), y = tv_as_i(b);
            *res = x < y ? -1 : x > y;
        } else {
            double x = tv_num(a), y = tv_num(b);
            *res = x < y ? -1 : x > y;
        }
        return 0;
    }
    if (a->k == TV_STR && b->k == TV_STR) {
        *res = str_cmp(a, b);
        return 0;
    }
    if (a->k == TV_LIST && b->k == TV_LIST && (a->flag & TVF_TUPLE) == (b->flag & TVF_TUPLE) &&
        !((a->flag | b->flag) & (TVF_GEN | TVF_RANGE))) {
        size_t n = KWK_MIN(a->u.l->n, b->u.l->n);
        for (size_t i = 0; i < n; i++) {
            if (tv_eq(&a->u.l->v[i], &b->u.l->v[i]))
                continue;
            return tv_cmp(r, at, &a->u.l->v[i], &b->u.l->v[i], res);
        }
        *res = a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n;
        return 0;
    }
    if (r->dialect == TD_HFJS && a->k == b->k && (a->k == TV_NONE || a->k == TV_UNDEF)) {
        *res = 0;
        return 0;
    }
    if (a->k == TV_UNDEF || b->k == TV_UNDEF)
        return tpl_undef_fail(r, at, a->k == TV_UNDEF ? a : b);
    return tpl_fail(r, KWK_ERUNTIME, at, "'<' not supported between instances of '%s' and '%s'",
                    tv_type_name(a), tv_type_name(b));
}

void tv_float_repr(double f, char *buf, size_t cap)
{
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f)
            break;
    }
    /* e is [-]d[.ddd]e[+-]XX: pull out digits and exponent. */
    char digits[32];
    int nd = 0, neg = 0;
    const char *p = e;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < 30)
            digits[nd++] = *p;
    int exp10 = *p == 'e' ? atoi(p + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    char out[64];
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (exp10 < -4 || exp10 >= 16) {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++)
                out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    } else if (exp10 < 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -exp10 - 1; i++)
            out[o++] = '0';
        for (int i = 0; i < nd; i++)
            out[o++] = digits[i];
        out[o] = 0;
    } else {
        for (int i = 0; i <= exp10; i++)
            out[o++] = i < nd ? digits[i] : '0';
        out[o++] = '.';
        if (nd > exp10 + 1) {
            for (int i = exp10 + 1; i < nd; i++)
                out[o++] = digits[i];
        } else {
            out[o++] = '0';
        }
        out[o] = 0;
    }
    snprintf(buf, cap, "%s", out);
}

static int py_printable(uint32_t cp)
{
    if (cp == ' ')
        return 1;
    if (cp < 0x20 || cp == 0x7f)
        return 0;
    if (cp < 0x7f)
        return 1;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return 0;
    default: return 1;
    }
}

static void repr_str(struct tbuf *b, const char *p, size_t n, char quote_pref)
{
    char q = quote_pref;
    if (!q) {
        q = '\'';
        if (memchr(p, '\'', n) && !memchr(p, '"', n))
            q = '"';
    }
    tb_putc(b, q);
    for (size_t i = 0; i < n;) {
        size_t l;
        uint32_t cp = tu_decode(p + i, n - i, &l);
        if (cp == (uint32_t)q || cp == '\\') {
            tb_putc(b, '\\');
            tb_putc(b, (char)cp);
        } else if (cp == '\n') {
            tb_puts(b, "\\n");
        } else if (cp == '\r') {
            tb_puts(b, "\\r");
        } else if (cp == '\t') {
            tb_puts(b, "\\t");
        } else if (py_printable(cp)) {
            tb_put(b, p + i, l);
        } else if (cp < 0x100) {
            tb_printf(b, "\\x%02x", cp);
        } else if (cp < 0x10000) {
            tb_printf(b, "\\u%04x", cp);
        } else {
            tb_printf(b, "\\U%08x", cp);
        }
        i += l;
    }
    tb_putc(b, q);
}

static int write_val(struct trender *r, struct tbuf *b, const struct tv *v, int as_repr,
                     int depth);

/* huggingface.js prints containers as JSON-like text with ", " and ": " separators. */
static int write_js(struct trender *r, struct tbuf *b, const struct tv *v, int depth)
{
    if (depth > 200)
        return tpl_fail(r, KWK_ELIMIT, NULL, "value nests too deeply to print");
    switch (v->k) {
    case TV_UNDEF: tb_puts(b, "undefined"); return 0;
    case TV_NONE: tb_puts(b, "null"); return 0;
    case TV_STR: {
        struct tjson_opts o = {.item_sep = ", ", .key_sep = ": "};
        return tpl_tojson(r, NULL, b, v, &o);
    }
    case TV_LIST:
        tb_putc(b, '[');
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                tb_puts(b, ", ");
            if (write_js(r, b, &v->u.l->v[i], depth + 1))
                return r->err->code;
        }
        tb_putc(b, ']');
        return 0;
    case TV_DICT:
        tb_putc(b, '{');
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i)
                tb_puts(b, ", ");
            if (write_js(r, b, &v->u.d->keys[i], depth + 1))
                return r->err->code;
            tb_puts(b, ": ");
            if (write_js(r, b, &v->u.d->vals[i], depth + 1))
                return r->err->code;
        }
        tb_putc(b, '}');
        return 0;
    default: return write_val(r, b, v, 0, depth + 1);
    }
}

static int write_val(struct trender *r, struct tbuf *b, const struct tv *v, int as_repr, int depth)
{
    char num[64];
    if (depth > 200)
        return tpl_fail(r, KWK_ELIMIT, NULL, "value nests too deeply to print");
    if (r->dialect == TD_HFJS && (v->k == TV_LIST || v->k == TV_DICT))
        return write_js(r, b, v, depth);
    switch (v->k) {
    case TV_UNDEF:
        if (as_repr)
            tb_puts(b, r->dialect == TD_HFJS ? "undefined" : "Undefined");
        break;
    case TV_NONE: tb_puts(b, r->dialect == TD_HFJS && as_repr ? "null" : "None"); break;
    case TV_BOOL:
        if (r->dialect == TD_HFJS)
            tb_puts(b, v->u.b ? "true" : "false");
        else
            tb_puts(b, v->u.b ? "True" : "False");
        break;
    case TV_INT: tb_printf(b, "%lld", (long long)v->u.i); break;
    case TV_FLOAT:
        tv_float_repr(v->u.f, num, sizeof num);
        tb_puts(b, num);
        break;
    case TV_STR:
        if (as_repr)
            repr_str(b, v->u.s.p, v->u.s.n, 0);
        else
            tb_put(b, v->u.s.p, v->u.s.n);
        break;
    case TV_LIST: {
        int tuple = v->flag & TVF_TUPLE;
        if (v->flag & TVF_RANGE) {
            const int64_t *rg = v->u.l->range;
            if (rg[2] == 1)
                tb_printf(b, "range(%lld, %lld)", (long long)rg[0], (long long)rg[1]);
            else
                tb_printf(b, "range(%lld, %lld, %lld)", (long long)rg[0], (long long)rg[1],
                          (long long)rg[2]);
            break;
        }
        if (v->flag & TVF_GEN) {
            tb_puts(b, "<generator object>");
            break;
        }
        tb_putc(b, tuple ? '(' : '[');
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                tb_puts(b, ", ");
            if (write_val(r, b, &v->u.l->v[i], 1, depth + 1))
                return r->err->code;
        }
        if (tuple && v->u.l->n == 1)
            tb_putc(b, ',');
        tb_putc(b, tuple ? ')' : ']');
        break;
    }
    case TV_NS:
        tb_puts(b, "<Namespace ");
        /* fall through */
    case TV_DICT:
        tb_putc(b, '{');
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i)
                tb_puts(b, ", ");
            if (write_val(r, b, &v->u.d->keys[i], 1, depth + 1))
                return r->err->code;
            tb_puts(b, ": ");
            if (write_val(r, b, &v->u.d->vals[i], 1, depth + 1))
                return r->err->code;
        }
        tb_putc(b, '}');
        if (v->k == TV_NS)
            tb_putc(b, '>');
        break;
    case TV_MACRO: tb_puts(b, "<Macro>"); break;
    case TV_LOOP: tb_puts(b, "<LoopContext>"); break;
    default: tb_puts(b, "<built-in function>"); break;
    }
    return 0;
}

int tv_write_str(struct trender *r, struct tbuf *b, const struct tv *v)
{
    if (v->k == TV_STR) {
        tb_put(b, v->u.s.p, v->u.s.n);
        return 0;
    }
    return write_val(r, b, v, 0, 0);
}

int tv_write_repr(struct trender *r, struct tbuf *b, const struct tv *v)
{
    return write_val(r, b, v, 1, 0);
}

int tv_to_str(struct trender *r, const struct tv *v, struct tv *out)
{
    if (v->k == TV_STR)
        tpl_work += v->u.s.n / 256;
    if (v->k == TV_STR) {
        *out = *v;
        return 0;
    }
    if (v->k == TV_UNDEF) {
        *out = tv_str("", 0);
        return 0;
    }
    struct tbuf b;
    tb_init(&b, r->max_output);
    int rc = tv_write_str(r, &b, v);
    if (rc) {
        tb_free(&b);
        return rc;
    }
    return tv_from_buf(r, &b, out);
}

int tv_len(struct trender *r, const struct tnode *at, const struct tv *v, int64_t *n)
{
    if (v->k == TV_LIST && (v->flag & TVF_GEN))
        return tpl_fail(r, KWK_ERUNTIME, at, "object of type 'generator' has no len()");
    switch (v->k) {
    case TV_UNDEF: *n = 0; return 0;
    case TV_STR: *n = (int64_t)tu_count(v->u.s.p, v->u.s.n); return 0;
    case TV_LIST: *n = (int64_t)v->u.l->n; return 0;
    case TV_DICT: *n = (int64_t)v->u.d->n; return 0;
    default:
        return tpl_fail(r, KWK_ERUNTIME, at, "object of type '%s' has no len()",
                        tv_type_name(v));
    }
}

int tv_iter(struct trender *r, const struct tnode *at, const struct tv *v, struct tlist **out)
{
    struct tv lv = {0};
    int rc;
    switch (v->k) {
    case TV_UNDEF:
        if ((rc = tv_new_list(r, 0, &lv)))
            return rc;
        *out = lv.u.l;
        return 0;
    case TV_LIST: *out = v->u.l; return 0;
    case TV_DICT:
        if ((rc = tv_new_list(r, v->u.d->n, &lv)))
            return rc;
        if (v->u.d->n)
            memcpy(lv.u.l->v, v->u.d->keys, v->u.d->n * sizeof(struct tv));
        lv.u.l->n = v->u.d->n;
        *out = lv.u.l;
        return 0;
    case TV_STR: {
        size_t cnt = tu_count(v->u.s.p, v->u.s.n);
        if ((rc = tv_new_list(r, cnt, &lv)))
            return rc;
        for (size_t i = 0, k = 0; i < v->u.s.n; k++) {
            size_t l;
            tu_decode(v->u.s.p + i, v->u.s.n - i, &l);
            lv.u.l->v[k] = tv_str(v->u.s.p + i, l);
            lv.u.l->n++;
            i += l;
        }
        *out = lv.u.l;
        return 0;
    }
    default:
        return tpl_fail(r, KWK_ERUNTIME, at, "'%s' object is not iterable", tv_type_name(v));
    }
}
