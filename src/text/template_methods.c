/* template_methods.c - attribute and item access as jinja2's sandbox does it, Python's string,
 * dict and list methods, slicing, "%" formatting and the global functions (range, namespace,
 * dict, raise_exception, strftime_now). One render per thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "text/template.h"

enum tmethod {
    M_NONE = 0,
    /* str */
    M_UPPER,
    M_LOWER,
    M_STRIP,
    M_LSTRIP,
    M_RSTRIP,
    M_SPLIT,
    M_RSPLIT,
    M_STARTSWITH,
    M_ENDSWITH,
    M_REPLACE,
    M_FIND,
    M_RFIND,
    M_COUNT,
    M_TITLE,
    M_CAPITALIZE,
    M_JOIN,
    M_SPLITLINES,
    M_FORMAT,
    M_ISDIGIT,
    M_ISALPHA,
    M_ISALNUM,
    M_ISSPACE,
    M_ISLOWER,
    M_ISUPPER,
    M_REMOVEPREFIX,
    M_REMOVESUFFIX,
    M_INDEX,
    /* dict */
    M_ITEMS,
    M_KEYS,
    M_VALUES,
    M_GET,
    /* list */
    M_APPEND,
    M_LINDEX,
    M_LCOUNT,
    /* loop */
    M_CYCLE,
};

struct mname {
    const char *name;
    int id;
};

static const struct mname str_methods[] = {
    {"upper", M_UPPER}, {"lower", M_LOWER}, {"strip", M_STRIP}, {"lstrip", M_LSTRIP},
    {"rstrip", M_RSTRIP}, {"split", M_SPLIT}, {"rsplit", M_RSPLIT},
    {"startswith", M_STARTSWITH}, {"endswith", M_ENDSWITH}, {"replace", M_REPLACE},
    {"find", M_FIND}, {"rfind", M_RFIND}, {"count", M_COUNT}, {"title", M_TITLE},
    {"capitalize", M_CAPITALIZE}, {"join", M_JOIN}, {"splitlines", M_SPLITLINES},
    {"format", M_FORMAT}, {"isdigit", M_ISDIGIT}, {"isalpha", M_ISALPHA},
    {"isalnum", M_ISALNUM}, {"isspace", M_ISSPACE}, {"islower", M_ISLOWER},
    {"isupper", M_ISUPPER}, {"removeprefix", M_REMOVEPREFIX},
    {"removesuffix", M_REMOVESUFFIX}, {"index", M_INDEX}, {NULL, 0}};
static const struct mname dict_methods[] = {
    {"items", M_ITEMS}, {"keys", M_KEYS}, {"values", M_VALUES}, {"get", M_GET}, {NULL, 0}};
static const struct mname list_methods[] = {
    {"append", M_APPEND}, {"index", M_LINDEX}, {"count", M_LCOUNT}, {NULL, 0}};

static int find_method(const struct mname *t, const char *name, size_t n)
{
    for (; t->name; t++)
        if (n && t->name[0] == name[0] && !strncmp(t->name, name, n) && t->name[n] == 0)
            return t->id;
    return -1;
}

int tpl_method_id(const struct tv *obj, const char *name, size_t n)
{
    switch (obj->k) {
    case TV_STR: return find_method(str_methods, name, n);
    case TV_DICT: return find_method(dict_methods, name, n);
    case TV_LIST:
        if (obj->flag & TVF_GEN)
            return -1;
        if (obj->flag & TVF_TUPLE) {
            int id = find_method(list_methods, name, n);
            return id == M_APPEND ? -1 : id;
        }
        return find_method(list_methods, name, n);
    case TV_LOOP: return n == 5 && !memcmp(name, "cycle", 5) ? M_CYCLE : -1;
    default: return -1;
    }
}

static int bind(struct trender *r, const struct tv *obj, int id, struct tv *out)
{
    struct tbound *bm = ta_alloc(r->a, sizeof *bm);
    if (!bm)
        return tpl_fail(r, KWK_ELIMIT, NULL, "template render ran out of its memory limit");
    bm->self = *obj;
    bm->method = id;
    memset(out, 0, sizeof *out);
    out->k = TV_METHOD;
    out->u.bm = bm;
    return 0;
}

static const char *const undef_descs[] = {"object", "None", "dict object", "tuple object",
                                          "list object", "str object", "int object",
                                          "float object", "bool object",
                                          "Namespace object", "generator object"};

const char *tpl_undef_desc(uint32_t idx)
{
    return idx < KWK_ARRAY_LEN(undef_descs) ? undef_descs[idx] : "object";
}

uint32_t tpl_undef_desc_of(const struct tv *v)
{
    switch (v->k) {
    case TV_NONE: return 1;
    case TV_DICT: return 2;
    case TV_LIST: return v->flag & TVF_GEN ? 10 : v->flag & TVF_TUPLE ? 3 : 4;
    case TV_STR: return 5;
    case TV_INT: return 6;
    case TV_FLOAT: return 7;
    case TV_BOOL: return 8;
    case TV_NS: return 9;
    default: return 0;
    }
}

static const char *obj_desc(const struct tv *v)
{
    return undef_descs[tpl_undef_desc_of(v)];
}

int tpl_getattr(struct trender *r, const struct tnode *at, const struct tv *obj, const char *name,
                size_t n, struct tv *out)
{
    if (obj->k == TV_UNDEF)
        return tpl_undef_fail(r, at, obj);
    if (obj->k == TV_LOOP) {
        if (tpl_method_id(obj, name, n) == M_CYCLE)
            return bind(r, obj, M_CYCLE, out);
        return tpl_loop_attr(r, at, obj, name, n, out);
    }
    int id = tpl_method_id(obj, name, n);
    if (id > 0)
        return bind(r, obj, id, out);
    if (obj->k == TV_DICT || obj->k == TV_NS) {
        const struct tv *x = td_get_str(obj->u.d, name, n);
        if (x) {
            *out = *x;
            return 0;
        }
    }
    *out = tv_undef_lazy(TU_ATTR + tpl_undef_desc_of(obj), name, n);
    return 0;
}

static int norm_index(int64_t i, size_t len, size_t *out)
{
    if (i < 0)
        i += (int64_t)len;
    if (i < 0 || (uint64_t)i >= len)
        return -1;
    *out = (size_t)i;
    return 0;
}

int tpl_getitem(struct trender *r, const struct tnode *at, const struct tv *obj,
                const struct tv *key, struct tv *out)
{
    size_t idx;
    if (obj->k == TV_UNDEF)
        return tpl_undef_fail(r, at, obj);
    if (obj->k == TV_DICT || obj->k == TV_NS) {
        const struct tv *x = td_get(obj->u.d, *key);
        if (x) {
            *out = *x;
            return 0;
        }
    } else if (obj->k == TV_LIST && (obj->flag & TVF_GEN)) {
        *out = tpl_undef(r, "'generator' object is not subscriptable");
        return 0;
    } else if ((obj->k == TV_LIST || obj->k == TV_STR) && (key->k == TV_INT || key->k == TV_BOOL)) {
        int64_t i = key->k == TV_INT ? key->u.i : key->u.b;
        if (obj->k == TV_LIST) {
            if (!norm_index(i, obj->u.l->n, &idx)) {
                *out = obj->u.l->v[idx];
                return 0;
            }
            *out = tpl_undef(r, "%s has no element %lld", obj_desc(obj), (long long)i);
            return 0;
        }
        size_t len = tu_count(obj->u.s.p, obj->u.s.n);
        if (!norm_index(i, len, &idx)) {
            size_t off = tu_offset(obj->u.s.p, obj->u.s.n, idx), l;
            tu_decode(obj->u.s.p + off, obj->u.s.n - off, &l);
            *out = tv_str(obj->u.s.p + off, l);
            return 0;
        }
        *out = tpl_undef(r, "str object has no element %lld", (long long)i);
        return 0;
    } else if (obj->k == TV_LOOP && key->k == TV_STR) {
        return tpl_getattr(r, at, obj, key->u.s.p, key->u.s.n, out);
    }
    if (key->k == TV_STR) {
        int id = tpl_method_id(obj, key->u.s.p, key->u.s.n);
        if (id > 0)
            return bind(r, obj, id, out);
        *out = tv_undef_lazy(TU_ATTR + tpl_undef_desc_of(obj), key->u.s.p, key->u.s.n);
        return 0;
    }
    *out = tpl_undef(r, "'%s' has no item", obj_desc(obj));
    return 0;
}

static int slice_arg(struct trender *r, const struct tnode *at, const struct tv *v, int64_t *out,
                     int *given)
{
    *given = 0;
    if (v->k == TV_NONE || v->k == TV_UNDEF)
        return 0;
    if (v->k != TV_INT && v->k != TV_BOOL)
        return tpl_fail(r, KWK_ERUNTIME, at, "slice indices must be integers or None");
    *out = v->k == TV_INT ? v->u.i : v->u.b;
    *given = 1;
    return 0;
}

int tpl_slice(struct trender *r, const struct tnode *at, const struct tv *obj, const struct tv *start,
              const struct tv *stop, const struct tv *step, struct tv *out)
{
    int64_t a = 0, b = 0, s = 1;
    int ga, gb, gs, rc;
    if (obj->k == TV_UNDEF)
        return tpl_undef_fail(r, at, obj);
    if ((rc = slice_arg(r, at, start, &a, &ga)) || (rc = slice_arg(r, at, stop, &b, &gb)) ||
        (rc = slice_arg(r, at, step, &s, &gs)))
        return rc;
    if (s == 0)
        return tpl_fail(r, KWK_ERUNTIME, at, "slice step cannot be zero");
    if (obj->k == TV_DICT)
        return tpl_fail(r, KWK_ERUNTIME, at, "unhashable type: 'slice'");
    if (obj->k == TV_LIST && (obj->flag & TVF_GEN))
        return tpl_fail(r, KWK_ERUNTIME, at, "'generator' object is not subscriptable");
    if (obj->k != TV_STR && obj->k != TV_LIST)
        return tpl_fail(r, KWK_ERUNTIME, at, "'%s' object is not subscriptable",
                        tv_type_name(obj));
    int64_t len = obj->k == TV_STR ? (int64_t)tu_count(obj->u.s.p, obj->u.s.n)
                                   : (int64_t)obj->u.l->n;
    /* PySlice_AdjustIndices */
    if (!ga)
        a = s < 0 ? len - 1 : 0;
    else if (a < 0)
        a = a + len < 0 ? (s < 0 ? -1 : 0) : a + len;
    else if (a >= len)
        a = s < 0 ? len - 1 : len;
    if (!gb)
        b = s < 0 ? -1 : len;
    else if (b < 0)
        b = b + len < 0 ? (s < 0 ? -1 : 0) : b + len;
    else if (b >= len)
        b = s < 0 ? len - 1 : len;
    if (obj->k == TV_LIST) {
        if ((rc = tv_new_list(r, 0, out)))
            return rc;
        out->flag = obj->flag & (TVF_TUPLE | TVF_RANGE);
        if (obj->flag & TVF_RANGE) {
            /* a slice of a range is a range */
            const int64_t *rg = obj->u.l->range;
            out->u.l->range[0] = rg[0] + a * rg[2];
            out->u.l->range[1] = rg[0] + b * rg[2];
            out->u.l->range[2] = rg[2] * s;
        }
        for (int64_t i = a; s > 0 ? i < b : i > b; i += s)
            if ((rc = tl_push(r, out->u.l, obj->u.l->v[i])))
                return rc;
        return 0;
    }
    /* Strings: index code point starts once, then copy. */
    size_t *offs = ta_alloc(r->a, ((size_t)len + 1) * sizeof *offs);
    if (!offs)
        return tpl_fail(r, KWK_ELIMIT, at, "template render ran out of its memory limit");
    for (size_t i = 0, k = 0; k <= (size_t)len; k++) {
        offs[k] = i;
        if (i < obj->u.s.n) {
            size_t l;
            tu_decode(obj->u.s.p + i, obj->u.s.n - i, &l);
            i += l;
        }
    }
    if (s == 1) {
        *out = a < b ? tv_str(obj->u.s.p + offs[a], offs[b] - offs[a]) : tv_str("", 0);
        return 0;
    }
    struct tbuf buf;
    tb_init(&buf, r->max_output);
    for (int64_t i = a; s > 0 ? i < b : i > b; i += s)
        tb_put(&buf, obj->u.s.p + offs[i], offs[i + 1] - offs[i]);
    return tv_from_buf(r, &buf, out);
}

const struct tv *targ(const struct targs *a, size_t i, const char *name)
{
    for (size_t k = 0; name && k < a->n_kw; k++) {
        size_t n = a->kw_names[k].n;
        if (!strncmp(name, a->kw_names[k].p, n) && name[n] == 0)
            return &a->kw[k];
    }
    return i < a->n_pos ? &a->pos[i] : NULL;
}

/* ---- string helpers ---- */

static int is_py_space(uint32_t cp)
{
    return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85 ||
           cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

static int in_chars(uint32_t cp, const struct tv *chars)
{
    if (!chars)
        return is_py_space(cp);
    for (size_t i = 0; i < chars->u.s.n;) {
        size_t l;
        if (tu_decode(chars->u.s.p + i, chars->u.s.n - i, &l) == cp)
            return 1;
        i += l;
    }
    return 0;
}

/* Start of the code point that ends at byte e. */
static size_t cp_back(const char *p, size_t e)
{
    size_t b = e - 1;
    while (b > 0 && ((unsigned char)p[b] & 0xC0) == 0x80 && e - b < 4)
        b--;
    size_t l;
    tu_decode(p + b, e - b, &l);
    return b + l == e ? b : e - 1;
}

int tpl_str_strip(const struct tv *s, const struct tv *chars, int left, int right, struct tv *out);

int tpl_str_strip(const struct tv *s, const struct tv *chars, int left, int right, struct tv *out)
{
    const char *p = s->u.s.p;
    size_t a = 0, b = s->u.s.n;
    if (chars && chars->k != TV_STR)
        chars = NULL;
    while (left && a < b) {
        size_t l;
        uint32_t cp = tu_decode(p + a, b - a, &l);
        if (!in_chars(cp, chars))
            break;
        a += l;
    }
    while (right && b > a) {
        size_t c = cp_back(p, b), l;
        uint32_t cp = tu_decode(p + c, b - c, &l);
        if (!in_chars(cp, chars))
            break;
        b = c;
    }
    *out = tv_str(p + a, b - a);
    return 0;
}

static int case_map(struct trender *r, const struct tv *s, int mode, struct tv *out)
{
    /* mode 0 upper, 1 lower, 2 title, 3 capitalize */
    struct tbuf b;
    tb_init(&b, r->max_output);
    int prev_cased = 0, first = 1;
    for (size_t i = 0; i < s->u.s.n;) {
        size_t l;
        uint32_t cp = tu_decode(s->u.s.p + i, s->u.s.n - i, &l);
        int32_t m = (int32_t)cp;
        int cat = utf8proc_category((utf8proc_int32_t)cp);
        int cased = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
                    cat == UTF8PROC_CATEGORY_LT;
        if (mode == 0)
            m = utf8proc_toupper(m);
        else if (mode == 1)
            m = utf8proc_tolower(m);
        else if (mode == 2)
            m = prev_cased ? utf8proc_tolower(m) : utf8proc_toupper(m);
        else
            m = first ? utf8proc_toupper(m) : utf8proc_tolower(m);
        if (mode == 2)
            prev_cased = cased;
        first = 0;
        if (m == (int32_t)cp)
            tb_put(&b, s->u.s.p + i, l);
        else
            tb_put_cp(&b, (uint32_t)m);
        i += l;
    }
    return tv_from_buf(r, &b, out);
}

int tpl_str_case(struct trender *r, const struct tv *s, int mode, struct tv *out);

int tpl_str_case(struct trender *r, const struct tv *s, int mode, struct tv *out)
{
    return case_map(r, s, mode, out);
}

static int split_ws(struct trender *r, const struct tv *s, int64_t maxsplit, int from_right,
                    struct tv *out)
{
    int rc;
    if ((rc = tv_new_list(r, 0, out)))
        return rc;
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    if (!from_right) {
        size_t i = 0;
        while (i < n) {
            size_t l;
            while (i < n && is_py_space(tu_decode(p + i, n - i, &l)))
                i += l;
            if (i >= n)
                break;
            if (maxsplit >= 0 && (int64_t)out->u.l->n >= maxsplit) {
                size_t e = n;
                /* the remainder keeps its trailing whitespace */
                if ((rc = tl_push(r, out->u.l, tv_str(p + i, e - i))))
                    return rc;
                break;
            }
            size_t st = i;
            while (i < n && !is_py_space(tu_decode(p + i, n - i, &l)))
                i += l;
            if ((rc = tl_push(r, out->u.l, tv_str(p + st, i - st))))
                return rc;
        }
        return 0;
    }
    /* rsplit: collect from the end, then reverse */
    size_t e = n;
    while (e > 0) {
        size_t l, c;
        while (e > 0 && (c = cp_back(p, e), is_py_space(tu_decode(p + c, e - c, &l))))
            e = c;
        if (!e)
            break;
        if (maxsplit >= 0 && (int64_t)out->u.l->n >= maxsplit) {
            if ((rc = tl_push(r, out->u.l, tv_str(p, e))))
                return rc;
            break;
        }
        size_t st = e;
        while (st > 0 && (c = cp_back(p, st), !is_py_space(tu_decode(p + c, st - c, &l))))
            st = c;
        if ((rc = tl_push(r, out->u.l, tv_str(p + st, e - st))))
            return rc;
        e = st;
    }
    for (size_t i = 0, j = out->u.l->n; i + 1 < j; i++, j--) {
        struct tv t = out->u.l->v[i];
        out->u.l->v[i] = out->u.l->v[j - 1];
        out->u.l->v[j - 1] = t;
    }
    return 0;
}

static int split_sep(struct trender *r, const struct tnode *at, const struct tv *s,
                     const struct tv *sep, int64_t maxsplit, int from_right, struct tv *out)
{
    int rc;
    if (!sep->u.s.n)
        return tpl_fail(r, KWK_ERUNTIME, at, "empty separator");
    if ((rc = tv_new_list(r, 0, out)))
        return rc;
    const char *p = s->u.s.p, *q = sep->u.s.p;
    size_t n = s->u.s.n, m = sep->u.s.n;
    if (!from_right) {
        size_t st = 0;
        for (;;) {
            const char *hit = NULL;
            if (maxsplit < 0 || (int64_t)out->u.l->n < maxsplit)
                hit = n - st >= m ? memmem(p + st, n - st, q, m) : NULL;
            if (!hit)
                return tl_push(r, out->u.l, tv_str(p + st, n - st));
            if ((rc = tl_push(r, out->u.l, tv_str(p + st, (size_t)(hit - (p + st))))))
                return rc;
            st = (size_t)(hit - p) + m;
        }
    }
    size_t e = n;
    for (;;) {
        size_t hit = SIZE_MAX;
        if ((maxsplit < 0 || (int64_t)out->u.l->n < maxsplit) && e >= m) {
            for (size_t i = e - m + 1; i-- > 0;)
                if (!memcmp(p + i, q, m)) {
                    hit = i;
                    break;
                }
        }
        if (hit == SIZE_MAX) {
            if ((rc = tl_push(r, out->u.l, tv_str(p, e))))
                return rc;
            break;
        }
        if ((rc = tl_push(r, out->u.l, tv_str(p + hit + m, e - hit - m))))
            return rc;
        e = hit;
    }
    for (size_t i = 0, j = out->u.l->n; i + 1 < j; i++, j--) {
        struct tv t = out->u.l->v[i];
        out->u.l->v[i] = out->u.l->v[j - 1];
        out->u.l->v[j - 1] = t;
    }
    return 0;
}

int tpl_str_replace(struct trender *r, const struct tnode *at, const struct tv *s,
                    const struct tv *old, const struct tv *new_, int64_t count, struct tv *out);

int tpl_str_replace(struct trender *r, const struct tnode *at, const struct tv *s,
                    const struct tv *old, const struct tv *new_, int64_t count, struct tv *out)
{
    struct tbuf b;
    tb_init(&b, r->max_output);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, m = old->u.s.n, i = 0;
    int64_t done = 0;
    if (!m) {
        /* Python inserts the replacement before every code point and at the end. */
        while (count < 0 || done < count) {
            tb_put(&b, new_->u.s.p, new_->u.s.n);
            done++;
            if (i >= n)
                break;
            size_t l;
            tu_decode(p + i, n - i, &l);
            tb_put(&b, p + i, l);
            i += l;
        }
        tb_put(&b, p + i, n - i);
        return tv_from_buf(r, &b, out);
    }
    while (i < n && (count < 0 || done < count)) {
        const char *hit = n - i >= m ? memmem(p + i, n - i, old->u.s.p, m) : NULL;
        if (!hit)
            break;
        tb_put(&b, p + i, (size_t)(hit - (p + i)));
        tb_put(&b, new_->u.s.p, new_->u.s.n);
        i = (size_t)(hit - p) + m;
        done++;
    }
    tb_put(&b, p + i, n - i);
    if (b.err)
        return tv_from_buf(r, &b, out);
    return tv_from_buf(r, &b, out);
}

static int need_str(struct trender *r, const struct tnode *at, const struct tv *v,
                    const char *what)
{
    if (!v || v->k != TV_STR)
        return tpl_fail(r, KWK_ERUNTIME, at, "%s: expected a string argument", what);
    return 0;
}

static int get_int(const struct tv *v, int64_t dflt, int64_t *out)
{
    if (!v || v->k == TV_NONE) {
        *out = dflt;
        return 0;
    }
    if (v->k == TV_INT || v->k == TV_BOOL) {
        *out = v->k == TV_INT ? v->u.i : v->u.b;
        return 0;
    }
    return -1;
}

static int affix(const struct tv *s, const struct tv *x, int end)
{
    if (x->u.s.n > s->u.s.n)
        return 0;
    const char *p = end ? s->u.s.p + s->u.s.n - x->u.s.n : s->u.s.p;
    return !memcmp(p, x->u.s.p, x->u.s.n);
}

/* Byte range [lo, hi) of code-point bounds start/end (Python slice rules). */
static void sub_range(const struct tv *s, const struct tv *start, const struct tv *end,
                      size_t *lo, size_t *hi)
{
    int64_t len = (int64_t)tu_count(s->u.s.p, s->u.s.n), a = 0, b = len;
    if (start && get_int(start, 0, &a) == 0 && start->k != TV_NONE) {
        if (a < 0)
            a = KWK_MAX(a + len, 0);
        a = KWK_MIN(a, len);
    }
    if (end && get_int(end, len, &b) == 0 && end->k != TV_NONE) {
        if (b < 0)
            b = KWK_MAX(b + len, 0);
        b = KWK_MIN(b, len);
    }
    if (b < a)
        b = a;
    *lo = tu_offset(s->u.s.p, s->u.s.n, (size_t)a);
    *hi = tu_offset(s->u.s.p, s->u.s.n, (size_t)b);
}

static int str_format(struct trender *r, const struct tnode *at, const struct tv *fmt,
                      const struct targs *a, struct tv *out)
{
    struct tbuf b;
    tb_init(&b, r->max_output);
    const char *p = fmt->u.s.p;
    size_t n = fmt->u.s.n, auto_idx = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') {
            tb_putc(&b, '{');
            i++;
        } else if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') {
            tb_putc(&b, '}');
            i++;
        } else if (p[i] == '{') {
            size_t j = i + 1;
            while (j < n && p[j] != '}')
                j++;
            if (j >= n) {
                rc = tpl_fail(r, KWK_ERUNTIME, at, "Single '{' encountered in format string");
                break;
            }
            const char *f = p + i + 1;
            size_t fl = j - i - 1;
            const struct tv *v = NULL;
            if (memchr(f, ':', fl) || memchr(f, '!', fl)) {
                rc = tpl_fail(r, KWK_EUNSUPPORTED, at, "format specs in str.format are not "
                              "supported");
                break;
            }
            if (!fl) {
                v = auto_idx < a->n_pos ? &a->pos[auto_idx] : NULL;
                auto_idx++;
            } else if (f[0] >= '0' && f[0] <= '9') {
                size_t k = (size_t)strtoul(f, NULL, 10);
                v = k < a->n_pos ? &a->pos[k] : NULL;
            } else {
                for (size_t k = 0; k < a->n_kw; k++)
                    if (a->kw_names[k].n == fl && !memcmp(a->kw_names[k].p, f, fl))
                        v = &a->kw[k];
            }
            if (!v) {
                rc = tpl_fail(r, KWK_ERUNTIME, at, "str.format: missing argument '%.*s'",
                              (int)fl, f);
                break;
            }
            rc = tv_write_str(r, &b, v);
            i = j;
        } else {
            tb_putc(&b, p[i]);
        }
    }
    if (rc) {
        tb_free(&b);
        return rc;
    }
    return tv_from_buf(r, &b, out);
}

static int str_is(const struct tv *s, int kind)
{
    if (!s->u.s.n)
        return 0;
    int any_cased = 0;
    for (size_t i = 0; i < s->u.s.n;) {
        size_t l;
        uint32_t cp = tu_decode(s->u.s.p + i, s->u.s.n - i, &l);
        int cat = utf8proc_category((utf8proc_int32_t)cp);
        int alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
        int digit = cat == UTF8PROC_CATEGORY_ND;
        i += l;
        switch (kind) {
        case M_ISDIGIT: if (!digit) return 0; break;
        case M_ISALPHA: if (!alpha) return 0; break;
        case M_ISALNUM:
            if (!alpha && !digit && cat != UTF8PROC_CATEGORY_NL && cat != UTF8PROC_CATEGORY_NO)
                return 0;
            break;
        case M_ISSPACE: if (!is_py_space(cp)) return 0; break;
        case M_ISLOWER:
            if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT)
                return 0;
            any_cased |= cat == UTF8PROC_CATEGORY_LL;
            break;
        case M_ISUPPER:
            if (cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT)
                return 0;
            any_cased |= cat == UTF8PROC_CATEGORY_LU;
            break;
        }
    }
    return kind == M_ISLOWER || kind == M_ISUPPER ? any_cased : 1;
}

static int call_str_method(struct trender *r, const struct tnode *at, int id, const struct tv *s,
                           const struct targs *a, struct tv *out)
{
    const struct tv *a0 = targ(a, 0, NULL), *a1 = targ(a, 1, NULL), *a2 = targ(a, 2, NULL);
    int64_t k;
    int rc;
    switch (id) {
    case M_UPPER: return case_map(r, s, 0, out);
    case M_LOWER: return case_map(r, s, 1, out);
    case M_TITLE: return case_map(r, s, 2, out);
    case M_CAPITALIZE: return case_map(r, s, 3, out);
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP:
        if (a0 && a0->k != TV_NONE && (rc = need_str(r, at, a0, "strip")))
            return rc;
        return tpl_str_strip(s, a0 && a0->k == TV_STR ? a0 : NULL, id != M_RSTRIP,
                             id != M_LSTRIP, out);
    case M_SPLIT:
    case M_RSPLIT: {
        const struct tv *sep = targ(a, 0, "sep"), *mx = targ(a, 1, "maxsplit");
        if (get_int(mx, -1, &k))
            return tpl_fail(r, KWK_ERUNTIME, at, "split: maxsplit must be an integer");
        if (!sep || sep->k == TV_NONE)
            return split_ws(r, s, k, id == M_RSPLIT, out);
        if ((rc = need_str(r, at, sep, "split")))
            return rc;
        return split_sep(r, at, s, sep, k, id == M_RSPLIT, out);
    }
    case M_SPLITLINES: {
        if ((rc = tv_new_list(r, 0, out)))
            return rc;
        size_t st = 0, i = 0, n = s->u.s.n;
        const char *p = s->u.s.p;
        while (i < n) {
            size_t l;
            uint32_t cp = tu_decode(p + i, n - i, &l);
            if (cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c ||
                cp == 0x1d || cp == 0x1e || cp == 0x85 || cp == 0x2028 || cp == 0x2029) {
                if ((rc = tl_push(r, out->u.l, tv_str(p + st, i - st))))
                    return rc;
                i += l;
                if (cp == '\r' && i < n && p[i] == '\n')
                    i++;
                st = i;
            } else {
                i += l;
            }
        }
        if (st < n)
            return tl_push(r, out->u.l, tv_str(p + st, n - st));
        return 0;
    }
    case M_STARTSWITH:
    case M_ENDSWITH: {
        if (!a0)
            return tpl_fail(r, KWK_ERUNTIME, at, "startswith/endswith need an argument");
        size_t lo, hi;
        sub_range(s, a1, a2, &lo, &hi);
        struct tv sub = tv_str(s->u.s.p + lo, hi - lo);
        if (a0->k == TV_LIST) {
            for (size_t i = 0; i < a0->u.l->n; i++) {
                if ((rc = need_str(r, at, &a0->u.l->v[i], "startswith")))
                    return rc;
                if (affix(&sub, &a0->u.l->v[i], id == M_ENDSWITH)) {
                    *out = tv_bool(1);
                    return 0;
                }
            }
            *out = tv_bool(0);
            return 0;
        }
        if ((rc = need_str(r, at, a0, "startswith")))
            return rc;
        *out = tv_bool(affix(&sub, a0, id == M_ENDSWITH));
        return 0;
    }
    case M_REPLACE: {
        const struct tv *cnt = targ(a, 2, "count");
        if ((rc = need_str(r, at, a0, "replace")) || (rc = need_str(r, at, a1, "replace")))
            return rc;
        if (get_int(cnt, -1, &k))
            return tpl_fail(r, KWK_ERUNTIME, at, "replace: count must be an integer");
        return tpl_str_replace(r, at, s, a0, a1, k, out);
    }
    case M_FIND:
    case M_RFIND:
    case M_INDEX:
    case M_COUNT: {
        if ((rc = need_str(r, at, a0, "find")))
            return rc;
        size_t lo, hi;
        sub_range(s, a1, a2, &lo, &hi);
        const char *p = s->u.s.p;
        size_t m = a0->u.s.n;
        int64_t found = -1, count = 0;
        if (m && id != M_RFIND) {
            /* forward searches: memmem is linear where a byte-by-byte probe is not */
            size_t i = lo;
            while (i + m <= hi) {
                const char *hit = memmem(p + i, hi - i, a0->u.s.p, m);
                if (!hit)
                    break;
                if (id != M_COUNT) {
                    found = (int64_t)(hit - p);
                    break;
                }
                count++;
                i = (size_t)(hit - p) + m;
            }
            if (id == M_COUNT) {
                tpl_work += (uint64_t)count;
                *out = tv_int(count);
                return 0;
            }
            if (found < 0 && id == M_INDEX)
                return tpl_fail(r, KWK_ERUNTIME, at, "substring not found");
            *out = tv_int(found < 0 ? -1 : (int64_t)tu_count(p, (size_t)found));
            return 0;
        }
        for (size_t i = lo; i + m <= hi; i++) {
            if (memcmp(p + i, a0->u.s.p, m))
                continue;
            if (id == M_COUNT) {
                count++;
                if (m)
                    i += m - 1;
                continue;
            }
            found = (int64_t)i;
            if (id != M_RFIND)
                break;
        }
        if (id == M_COUNT) {
            if (!m)
                count = (int64_t)tu_count(p + lo, hi - lo) + 1;
            *out = tv_int(count);
            return 0;
        }
        if (found < 0 && id == M_INDEX)
            return tpl_fail(r, KWK_ERUNTIME, at, "substring not found");
        *out = tv_int(found < 0 ? -1 : (int64_t)tu_count(p, (size_t)found));
        return 0;
    }
    case M_JOIN: {
        struct tlist *items;
        if (!a0)
            return tpl_fail(r, KWK_ERUNTIME, at, "join() takes exactly one argument");
        if ((rc = tv_iter(r, at, a0, &items)))
            return rc;
        struct tbuf b;
        tb_init(&b, r->max_output);
        for (size_t i = 0; i < items->n; i++) {
            if (items->v[i].k != TV_STR) {
                tb_free(&b);
                return tpl_fail(r, KWK_ERUNTIME, at, "sequence item %zu: expected str instance, "
                                "%s found", i, tv_type_name(&items->v[i]));
            }
            if (i)
                tb_put(&b, s->u.s.p, s->u.s.n);
            tb_put(&b, items->v[i].u.s.p, items->v[i].u.s.n);
        }
        return tv_from_buf(r, &b, out);
    }
    case M_FORMAT: return str_format(r, at, s, a, out);
    case M_REMOVEPREFIX:
    case M_REMOVESUFFIX:
        if ((rc = need_str(r, at, a0, "removeprefix")))
            return rc;
        *out = *s;
        if (affix(s, a0, id == M_REMOVESUFFIX)) {
            out->u.s.n -= a0->u.s.n;
            if (id == M_REMOVEPREFIX)
                out->u.s.p += a0->u.s.n;
        }
        return 0;
    default: *out = tv_bool(str_is(s, id)); return 0;
    }
}

int tpl_dict_items(struct trender *r, const struct tdict *d, struct tv *out);

int tpl_dict_items(struct trender *r, const struct tdict *d, struct tv *out)
{
    int rc;
    if ((rc = tv_new_list(r, d->n, out)))
        return rc;
    for (size_t i = 0; i < d->n; i++) {
        struct tv pair;
        if ((rc = tv_new_list(r, 2, &pair)))
            return rc;
        pair.flag = TVF_TUPLE;
        pair.u.l->v[0] = d->keys[i];
        pair.u.l->v[1] = d->vals[i];
        pair.u.l->n = 2;
        out->u.l->v[out->u.l->n++] = pair;
    }
    return 0;
}

int tpl_call_method(struct trender *r, const struct tnode *at, const struct tbound *bm,
                    const struct targs *a, struct tv *out)
{
    const struct tv *self = &bm->self;
    if (self->k == TV_STR)
        tpl_work += self->u.s.n / 16; /* string methods scan their string (some twice) */
    const struct tv *a0 = targ(a, 0, NULL);
    int rc;
    switch (bm->method) {
    case M_ITEMS: return tpl_dict_items(r, self->u.d, out);
    case M_KEYS:
    case M_VALUES:
        if ((rc = tv_new_list(r, self->u.d->n, out)))
            return rc;
        if (self->u.d->n)
            memcpy(out->u.l->v, bm->method == M_KEYS ? self->u.d->keys : self->u.d->vals,
                   self->u.d->n * sizeof(struct tv));
        out->u.l->n = self->u.d->n;
        return 0;
    case M_GET: {
        if (!a0)
            return tpl_fail(r, KWK_ERUNTIME, at, "get expected at least 1 argument, got 0");
        const struct tv *x = td_get(self->u.d, *a0), *dflt = targ(a, 1, NULL);
        *out = x ? *x : dflt ? *dflt : tv_none();
        return 0;
    }
    case M_APPEND:
        if (!a0)
            return tpl_fail(r, KWK_ERUNTIME, at, "append() takes exactly one argument");
        if ((rc = tl_push(r, self->u.l, *a0)))
            return rc;
        *out = tv_none();
        return 0;
    case M_LINDEX:
    case M_LCOUNT: {
        int64_t count = 0;
        if (!a0)
            return tpl_fail(r, KWK_ERUNTIME, at, "index/count take one argument");
        for (size_t i = 0; i < self->u.l->n; i++) {
            if (!tv_eq(&self->u.l->v[i], a0))
                continue;
            if (bm->method == M_LINDEX) {
                *out = tv_int((int64_t)i);
                return 0;
            }
            count++;
        }
        if (bm->method == M_LINDEX)
            return tpl_fail(r, KWK_ERUNTIME, at, "value is not in list");
        *out = tv_int(count);
        return 0;
    }
    case M_CYCLE: return tpl_loop_cycle(r, at, self, a, out);
    default:
        if ((rc = call_str_method(r, at, bm->method, self, a, out)))
            return rc;
        if ((self->flag & TVF_SAFE) && out->k == TV_STR && bm->method != M_FORMAT &&
            bm->method != M_JOIN)
            out->flag |= TVF_SAFE;
        return 0;
    }
}

/* ---- "%" formatting ---- */

/* Digits of a %-format width or precision: 8 keep them below 10^8, far past any render. */
#define PCT_MAX_DIGITS 8

static int pct_one(struct trender *r, const struct tnode *at, struct tbuf *b, const char *flags,
                   int width, int prec, char conv, const struct tv *v)
{
    char spec[32], tmp[512];
    int rc;
    if (conv == 's' || conv == 'r' || conv == 'a') {
        struct tbuf s;
        tb_init(&s, r->max_output);
        rc = conv == 's' ? tv_write_str(r, &s, v) : tv_write_repr(r, &s, v);
        if (rc) {
            tb_free(&s);
            return rc;
        }
        size_t len = s.n, cps = tu_count(s.p ? s.p : "", s.n);
        if (prec >= 0 && (size_t)prec < cps) {
            len = tu_offset(s.p, s.n, (size_t)prec);
            cps = (size_t)prec;
        }
        int left = strchr(flags, '-') != NULL;
        size_t pad = width > 0 && (size_t)width > cps ? (size_t)width - cps : 0;
        if (pad > r->max_output) {
            tb_free(&s);
            return tpl_fail(r, KWK_ELIMIT, at, "format width past the output limit");
        }
        for (size_t i = 0; !left && i < pad; i++)
            tb_putc(b, ' ');
        tb_put(b, s.p ? s.p : "", len);
        for (size_t i = 0; left && i < pad; i++)
            tb_putc(b, ' ');
        tb_free(&s);
        return 0;
    }
    if (!tv_is_num(v))
        return tpl_fail(r, KWK_ERUNTIME, at, "%%%c format: a real number is required, not %s",
                        conv, tv_type_name(v));
    if (conv == 'd' || conv == 'i' || conv == 'u' || conv == 'x' || conv == 'X' || conv == 'o') {
        if (v->k == TV_FLOAT && (conv == 'x' || conv == 'X' || conv == 'o'))
            return tpl_fail(r, KWK_ERUNTIME, at, "%%%c format: an integer is required", conv);
        snprintf(spec, sizeof spec, "%%%s%s%s%s", flags, width >= 0 ? "*" : "",
                 prec >= 0 ? ".*" : "", conv == 'i' || conv == 'u' ? "lld" : conv == 'd' ? "lld"
                 : conv == 'x' ? "llx" : conv == 'X' ? "llX" : "llo");
    } else if (strchr("eEfFgG", conv)) {
        snprintf(spec, sizeof spec, "%%%s%s%s%c", flags, width >= 0 ? "*" : "",
                 prec >= 0 ? ".*" : "", conv);
    } else {
        return tpl_fail(r, KWK_EUNSUPPORTED, at, "unsupported format character '%c'", conv);
    }
    if (width > 200 || prec > 200)
        return tpl_fail(r, KWK_ELIMIT, at, "format width too large");
    long long iv = v->k == TV_FLOAT ? (long long)v->u.f : v->k == TV_INT ? v->u.i : v->u.b;
    double dv = tv_num(v);
    int isint = !strchr("eEfFgG", conv);
    if (width >= 0 && prec >= 0)
        isint ? snprintf(tmp, sizeof tmp, spec, width, prec, iv)
              : snprintf(tmp, sizeof tmp, spec, width, prec, dv);
    else if (width >= 0)
        isint ? snprintf(tmp, sizeof tmp, spec, width, iv) : snprintf(tmp, sizeof tmp, spec, width, dv);
    else if (prec >= 0)
        isint ? snprintf(tmp, sizeof tmp, spec, prec, iv) : snprintf(tmp, sizeof tmp, spec, prec, dv);
    else
        isint ? snprintf(tmp, sizeof tmp, spec, iv) : snprintf(tmp, sizeof tmp, spec, dv);
    tb_puts(b, tmp);
    return 0;
}

static int percent_format(struct trender *r, const struct tnode *at, const struct tv *fmt,
                          const struct tv *args, struct tv *out);

/* Markup % args escapes every argument's text. */
static int escape_args(struct trender *r, const struct tv *args, struct tv *out)
{
    int rc;
    if (args->k == TV_STR && !(args->flag & TVF_SAFE))
        return tpl_html_escape(r, args, out);
    if (args->k == TV_LIST && (args->flag & TVF_TUPLE)) {
        if ((rc = tv_new_list(r, args->u.l->n, out)))
            return rc;
        out->flag = TVF_TUPLE;
        for (size_t i = 0; i < args->u.l->n; i++) {
            const struct tv *v = &args->u.l->v[i];
            out->u.l->v[i] = *v;
            if (v->k == TV_STR && !(v->flag & TVF_SAFE) &&
                (rc = tpl_html_escape(r, v, &out->u.l->v[i])))
                return rc;
        }
        out->u.l->n = args->u.l->n;
        return 0;
    }
    *out = *args;
    return 0;
}

int tpl_percent_format(struct trender *r, const struct tnode *at, const struct tv *fmt,
                       const struct tv *args, struct tv *out)
{
    int rc;
    if (!(fmt->flag & TVF_SAFE))
        return percent_format(r, at, fmt, args, out);
    struct tv esc;
    if ((rc = escape_args(r, args, &esc)) || (rc = percent_format(r, at, fmt, &esc, out)))
        return rc;
    out->flag |= TVF_SAFE;
    return 0;
}

static int percent_format(struct trender *r, const struct tnode *at, const struct tv *fmt,
                          const struct tv *args, struct tv *out)
{
    const struct tv *items = args;
    size_t n_items = 1, next = 0;
    int rc = 0;
    if (args->k == TV_LIST && (args->flag & TVF_TUPLE)) {
        items = args->u.l->v;
        n_items = args->u.l->n;
    }
    struct tbuf b;
    tb_init(&b, r->max_output);
    const char *p = fmt->u.s.p;
    size_t n = fmt->u.s.n;
    for (size_t i = 0; i < n && !rc; i++) {
        if (p[i] != '%') {
            tb_putc(&b, p[i]);
            continue;
        }
        if (++i >= n) {
            rc = tpl_fail(r, KWK_ERUNTIME, at, "incomplete format");
            break;
        }
        const struct tv *v = NULL;
        if (p[i] == '(') {
            size_t j = i + 1;
            while (j < n && p[j] != ')')
                j++;
            if (j >= n || args->k != TV_DICT) {
                rc = tpl_fail(r, KWK_ERUNTIME, at, "format requires a mapping");
                break;
            }
            v = td_get_str(args->u.d, p + i + 1, j - i - 1);
            if (!v) {
                rc = tpl_fail(r, KWK_ERUNTIME, at, "format key '%.*s' missing",
                              (int)(j - i - 1), p + i + 1);
                break;
            }
            i = j + 1;
        }
        char flags[8];
        size_t nf = 0;
        while (i < n && strchr("-+ #0", p[i]) && nf < sizeof flags - 1)
            flags[nf++] = p[i++];
        flags[nf] = 0;
        /* Python pads to any width its memory allows; here a width or precision past
         * PCT_MAX_DIGITS digits is an error (the output limit would stop the render anyway). */
        int width = -1, prec = -1, wd = 0, pd = 0;
        while (i < n && p[i] >= '0' && p[i] <= '9' && wd++ < PCT_MAX_DIGITS)
            width = (width < 0 ? 0 : width) * 10 + (p[i++] - '0');
        if (i < n && p[i] == '.') {
            prec = 0;
            i++;
            while (i < n && p[i] >= '0' && p[i] <= '9' && pd++ < PCT_MAX_DIGITS)
                prec = prec * 10 + (p[i++] - '0');
        }
        if (wd > PCT_MAX_DIGITS || pd > PCT_MAX_DIGITS) {
            rc = tpl_fail(r, KWK_ERUNTIME, at, "format width or precision over %d digits",
                          PCT_MAX_DIGITS);
            break;
        }
        if (i >= n) {
            rc = tpl_fail(r, KWK_ERUNTIME, at, "incomplete format");
            break;
        }
        if (p[i] == '%') {
            tb_putc(&b, '%');
            continue;
        }
        if (!v) {
            if (next >= n_items) {
                rc = tpl_fail(r, KWK_ERUNTIME, at, "not enough arguments for format string");
                break;
            }
            v = &items[next++];
        }
        rc = pct_one(r, at, &b, flags, width, prec, p[i], v);
    }
    /* Python: unused arguments are an error unless they come as a mapping-like object
     * (anything subscriptable that is neither a tuple nor a string). */
    if (!rc && next < n_items &&
        ((args->flag & (TVF_TUPLE | TVF_GEN)) || !(args->k == TV_DICT || args->k == TV_LIST)))
        rc = tpl_fail(r, KWK_ERUNTIME, at, "not all arguments converted during string "
                      "formatting");
    if (rc) {
        tb_free(&b);
        return rc;
    }
    return tv_from_buf(r, &b, out);
}

/* ---- globals ---- */

int tpl_builtin_id(const char *p, size_t n)
{
    static const struct mname names[] = {
        {"range", TB_RANGE}, {"namespace", TB_NAMESPACE}, {"dict", TB_DICT},
        {"raise_exception", TB_RAISE}, {"strftime_now", TB_STRFTIME}, {"cycler", TB_CYCLER},
        {"joiner", TB_JOINER}, {"lipsum", TB_LIPSUM}, {NULL, 0}};
    int id = find_method(names, p, n);
    return id < 0 ? 0 : id;
}

static int kw_dict(struct trender *r, const struct targs *a, int ns, struct tv *out)
{
    int rc;
    if ((rc = tv_new_dict(r, a->n_kw, out)))
        return rc;
    if (a->n_pos > 1)
        return tpl_fail(r, KWK_ERUNTIME, NULL, "expected at most 1 positional argument");
    if (a->n_pos == 1) {
        const struct tv *src = &a->pos[0];
        if (src->k == TV_DICT || src->k == TV_NS) {
            for (size_t i = 0; i < src->u.d->n; i++)
                if ((rc = td_set(r, out->u.d, src->u.d->keys[i], src->u.d->vals[i])))
                    return rc;
        } else if (src->k == TV_LIST) {
            for (size_t i = 0; i < src->u.l->n; i++) {
                const struct tv *pair = &src->u.l->v[i];
                if (pair->k != TV_LIST || pair->u.l->n != 2)
                    return tpl_fail(r, KWK_ERUNTIME, NULL, "dictionary update sequence element "
                                    "has the wrong length");
                if ((rc = td_set(r, out->u.d, pair->u.l->v[0], pair->u.l->v[1])))
                    return rc;
            }
        } else if (src->k != TV_UNDEF) {
            return tpl_fail(r, KWK_ERUNTIME, NULL, "'%s' object is not iterable",
                            tv_type_name(src));
        }
    }
    for (size_t i = 0; i < a->n_kw; i++) {
        struct tv key;
        if (ns && a->kw_names[i].n && a->kw_names[i].p[0] == '_')
            return tpl_fail(r, KWK_ERUNTIME, NULL, "chat templates cannot store "
                            "underscore-prefixed attributes on a namespace");
        if ((rc = tv_str_copy(r, a->kw_names[i].p, a->kw_names[i].n, &key)) ||
            (rc = td_set(r, out->u.d, key, a->kw[i])))
            return rc;
    }
    if (ns)
        out->k = TV_NS;
    return 0;
}

static int builtin_range(struct trender *r, const struct tnode *at, const struct targs *a,
                         struct tv *out)
{
    int64_t v[3] = {0, 0, 1};
    int rc;
    if (a->n_pos < 1 || a->n_pos > 3)
        return tpl_fail(r, KWK_ERUNTIME, at, "range expected 1 to 3 arguments");
    for (size_t i = 0; i < a->n_pos; i++)
        if (get_int(&a->pos[i], 0, &v[a->n_pos == 1 ? 1 : i]))
            return tpl_fail(r, KWK_ERUNTIME, at, "'%s' object cannot be interpreted as an "
                            "integer", tv_type_name(&a->pos[i]));
    if (v[2] == 0)
        return tpl_fail(r, KWK_ERUNTIME, at, "range() arg 3 must not be zero");
    double count = v[2] > 0 ? ((double)v[1] - (double)v[0]) / (double)v[2]
                            : ((double)v[0] - (double)v[1]) / (double)-v[2];
    if (count > (double)(r->max_steps - KWK_MIN(r->steps, r->max_steps)) || count > 1e8)
        return tpl_fail(r, KWK_ELIMIT, at, "range too large for the step limit");
    if ((rc = tv_new_list(r, 0, out)))
        return rc;
    out->flag = TVF_RANGE;
    memcpy(out->u.l->range, v, sizeof v);
    for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) {
        if ((rc = tl_push(r, out->u.l, tv_int(i))) || (rc = tpl_step(r, at)))
            return rc;
        if ((v[2] > 0 && i > INT64_MAX - v[2]) || (v[2] < 0 && i < INT64_MIN - v[2]))
            break;
    }
    return 0;
}

static int builtin_strftime(struct trender *r, const struct tnode *at, const struct targs *a,
                            struct tv *out)
{
    const struct tv *f = targ(a, 0, "format");
    if (!f || f->k != TV_STR)
        return tpl_fail(r, KWK_ERUNTIME, at, "strftime_now expects a format string");
    struct tm tm;
    time_t t;
    if (r->have_now) {
        /* A fixed clock is a wall-clock time given as seconds since the epoch (UTC fields). */
        t = (time_t)r->now;
        gmtime_r(&t, &tm);
    } else {
        t = time(NULL);
        localtime_r(&t, &tm);
    }
    char fmt[256], buf[1024];
    if (f->u.s.n >= sizeof fmt)
        return tpl_fail(r, KWK_ELIMIT, at, "strftime_now format too long");
    memcpy(fmt, f->u.s.p, f->u.s.n);
    fmt[f->u.s.n] = 0;
    size_t n = f->u.s.n ? strftime(buf, sizeof buf, fmt, &tm) : 0;
    return tv_str_copy(r, buf, n, out);
}

int tpl_call_builtin(struct trender *r, const struct tnode *at, int id, const struct targs *a,
                     struct tv *out)
{
    switch (id) {
    case TB_RANGE: return builtin_range(r, at, a, out);
    case TB_NAMESPACE: return kw_dict(r, a, 1, out);
    case TB_DICT: return kw_dict(r, a, 0, out);
    case TB_RAISE: {
        const struct tv *m = targ(a, 0, "message");
        struct tv s = tv_str("", 0);
        if (m && tv_to_str(r, m, &s))
            return r->err->code;
        /* The message alone, as jinja2's TemplateError carries it. */
        kwk_err_set(r->err, KWK_ERUNTIME, "%.*s", (int)KWK_MIN(s.u.s.n, (size_t)500), s.u.s.p);
        if (r->err) {
            r->err->line = at->line;
            r->err->col = at->col;
        }
        return KWK_ERUNTIME;
    }
    case TB_STRFTIME: return builtin_strftime(r, at, a, out);
    default:
        return tpl_fail(r, KWK_EUNSUPPORTED, at, "this global function is not supported");
    }
}
