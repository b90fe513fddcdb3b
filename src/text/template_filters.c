/* template_filters.c - jinja2's filters and tests as chat templates use them (with transformers'
 * tojson). One render per thread. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/template.h"

int tpl_str_strip(const struct tv *s, const struct tv *chars, int left, int right, struct tv *out);
int tpl_str_case(struct trender *r, const struct tv *s, int mode, struct tv *out);
int tpl_str_replace(struct trender *r, const struct tnode *at, const struct tv *s,
                    const struct tv *old, const struct tv *new_, int64_t count, struct tv *out);
int tpl_dict_items(struct trender *r, const struct tdict *d, struct tv *out);

enum tfilter {
    F_ABS = 1, F_ATTR, F_BATCH, F_CAPITALIZE, F_CENTER, F_COUNT, F_D, F_DEFAULT, F_DICTSORT,
    F_E, F_ESCAPE, F_FIRST, F_FLOAT, F_FORMAT, F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST,
    F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_PPRINT, F_REJECT, F_REJECTATTR,
    F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM,
    F_TITLE, F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT, F_FORCEESCAPE,
};

static const struct {
    const char *name;
    int id;
} filters[] = {
    {"abs", F_ABS}, {"attr", F_ATTR}, {"batch", F_BATCH}, {"capitalize", F_CAPITALIZE},
    {"center", F_CENTER}, {"count", F_COUNT}, {"d", F_D}, {"default", F_DEFAULT},
    {"dictsort", F_DICTSORT}, {"e", F_E}, {"escape", F_ESCAPE}, {"first", F_FIRST},
    {"float", F_FLOAT}, {"format", F_FORMAT}, {"indent", F_INDENT}, {"int", F_INT},
    {"items", F_ITEMS}, {"join", F_JOIN}, {"last", F_LAST}, {"length", F_LENGTH},
    {"list", F_LIST}, {"lower", F_LOWER}, {"map", F_MAP}, {"max", F_MAX}, {"min", F_MIN},
    {"pprint", F_PPRINT}, {"reject", F_REJECT}, {"rejectattr", F_REJECTATTR},
    {"replace", F_REPLACE}, {"reverse", F_REVERSE}, {"round", F_ROUND}, {"safe", F_SAFE},
    {"select", F_SELECT}, {"selectattr", F_SELECTATTR}, {"sort", F_SORT},
    {"string", F_STRING}, {"sum", F_SUM}, {"title", F_TITLE}, {"tojson", F_TOJSON},
    {"trim", F_TRIM}, {"unique", F_UNIQUE}, {"upper", F_UPPER}, {"wordcount", F_WORDCOUNT},
    {"forceescape", F_FORCEESCAPE},
};

int tpl_filter_id(const char *p, size_t n)
{
    for (size_t i = 0; i < KWK_ARRAY_LEN(filters); i++)
        if (strlen(filters[i].name) == n && !memcmp(filters[i].name, p, n))
            return filters[i].id;
    return -1;
}

enum ttest {
    T_DEFINED = 1, T_UNDEFINED, T_NONE, T_BOOLEAN, T_FALSE, T_TRUE, T_INTEGER, T_FLOAT,
    T_NUMBER, T_STRING, T_MAPPING, T_ITERABLE, T_SEQUENCE, T_CALLABLE, T_SAMEAS, T_ESCAPED,
    T_ODD, T_EVEN, T_DIVISIBLEBY, T_EQ, T_NE, T_LT, T_LE, T_GT, T_GE, T_IN, T_LOWER, T_UPPER,
    T_FILTER, T_TEST,
};

static const struct {
    const char *name;
    int id;
} tests[] = {
    {"defined", T_DEFINED}, {"undefined", T_UNDEFINED}, {"none", T_NONE},
    {"boolean", T_BOOLEAN}, {"false", T_FALSE}, {"true", T_TRUE}, {"integer", T_INTEGER},
    {"float", T_FLOAT}, {"number", T_NUMBER}, {"string", T_STRING}, {"mapping", T_MAPPING},
    {"iterable", T_ITERABLE}, {"sequence", T_SEQUENCE}, {"callable", T_CALLABLE},
    {"sameas", T_SAMEAS}, {"escaped", T_ESCAPED}, {"odd", T_ODD}, {"even", T_EVEN},
    {"divisibleby", T_DIVISIBLEBY}, {"eq", T_EQ}, {"equalto", T_EQ}, {"==", T_EQ},
    {"ne", T_NE}, {"!=", T_NE}, {"lt", T_LT}, {"lessthan", T_LT}, {"<", T_LT}, {"le", T_LE},
    {"<=", T_LE}, {"gt", T_GT}, {"greaterthan", T_GT}, {">", T_GT}, {"ge", T_GE},
    {">=", T_GE}, {"in", T_IN}, {"lower", T_LOWER}, {"upper", T_UPPER}, {"filter", T_FILTER},
    {"test", T_TEST},
};

int tpl_test_id(const char *p, size_t n)
{
    for (size_t i = 0; i < KWK_ARRAY_LEN(tests); i++)
        if (strlen(tests[i].name) == n && !memcmp(tests[i].name, p, n))
            return tests[i].id;
    return -1;
}

/* ---- tests ---- */

static int need_int(struct trender *r, const struct tnode *at, const struct tv *v, int64_t *out)
{
    if (v->k == TV_INT || v->k == TV_BOOL) {
        *out = v->k == TV_INT ? v->u.i : v->u.b;
        return 0;
    }
    if (v->k == TV_UNDEF)
        return tpl_undef_fail(r, at, v);
    return tpl_fail(r, KWK_ERUNTIME, at, "expected an integer, got %s", tv_type_name(v));
}

int tpl_run_test(struct trender *r, const struct tnode *at, int id, const struct tv *v,
                 const struct tv *args, size_t n_args, int *res)
{
    const struct tv *a0 = n_args ? &args[0] : NULL;
    int64_t x = 0, y = 0;
    int rc, c;
    switch (id) {
    case T_DEFINED: *res = v->k != TV_UNDEF; return 0;
    case T_UNDEFINED: *res = v->k == TV_UNDEF; return 0;
    case T_NONE: *res = v->k == TV_NONE; return 0;
    case T_BOOLEAN: *res = v->k == TV_BOOL; return 0;
    case T_FALSE: *res = v->k == TV_BOOL && !v->u.b; return 0;
    case T_TRUE: *res = v->k == TV_BOOL && v->u.b; return 0;
    case T_INTEGER: *res = v->k == TV_INT; return 0;
    case T_FLOAT: *res = v->k == TV_FLOAT; return 0;
    case T_NUMBER: *res = tv_is_num(v); return 0;
    case T_STRING: *res = v->k == TV_STR; return 0;
    case T_MAPPING: *res = v->k == TV_DICT; return 0;
    case T_ITERABLE:
        *res = v->k == TV_STR || v->k == TV_LIST || v->k == TV_DICT || v->k == TV_UNDEF;
        return 0;
    case T_SEQUENCE:
        /* jinja2's Undefined has __len__ and __getitem__, so it counts as a sequence */
        *res = v->k == TV_STR || (v->k == TV_LIST && !(v->flag & TVF_GEN)) || v->k == TV_DICT ||
               v->k == TV_UNDEF;
        return 0;
    case T_CALLABLE:
        *res = v->k == TV_MACRO || v->k == TV_BUILTIN || v->k == TV_METHOD;
        return 0;
    case T_ESCAPED: *res = 0; return 0;
    case T_ODD:
    case T_EVEN:
    case T_DIVISIBLEBY: {
        /* jinja2: value % 2 == 1, value % 2 == 0, value % num == 0 (Python numbers) */
        struct tv two = tv_int(2);
        const struct tv *d = id == T_DIVISIBLEBY ? a0 : &two;
        if (!d)
            return tpl_fail(r, KWK_ERUNTIME, at, "divisibleby needs an argument");
        if (v->k == TV_UNDEF)
            return tpl_undef_fail(r, at, v);
        if (!tv_is_num(v) || !tv_is_num(d))
            return tpl_fail(r, KWK_ERUNTIME, at, "unsupported operand type(s) for %%: '%s' and "
                            "'%s'", tv_type_name(v), tv_type_name(d));
        if (v->k != TV_FLOAT && d->k != TV_FLOAT) {
            if ((rc = need_int(r, at, v, &x)) || (rc = need_int(r, at, d, &y)))
                return rc;
            if (!y)
                return tpl_fail(r, KWK_ERUNTIME, at, "integer division or modulo by zero");
            int64_t m = y == -1 ? 0 : x % y;
            if (m != 0 && ((m < 0) != (y < 0)))
                m += y;
            *res = id == T_ODD ? m == 1 : m == 0;
        } else {
            double fx = tv_num(v), fy = tv_num(d);
            if (fy == 0.0)
                return tpl_fail(r, KWK_ERUNTIME, at, "float modulo");
            double m = fmod(fx, fy);
            if (m != 0.0 && ((m < 0) != (fy < 0)))
                m += fy;
            *res = id == T_ODD ? m == 1.0 : m == 0.0;
        }
        return 0;
    }
    case T_SAMEAS:
        if (!a0)
            return tpl_fail(r, KWK_ERUNTIME, at, "sameas needs an argument");
        if (v->k != a0->k)
            *res = 0;
        else if (v->k == TV_NONE || v->k == TV_UNDEF)
            *res = 1;
        else if (v->k == TV_BOOL || v->k == TV_INT)
            *res = tv_eq(v, a0);
        else
            *res = v->k >= TV_LIST && v->u.l == a0->u.l;
        return 0;
    case T_EQ:
    case T_NE:
        if (!a0)
            return tpl_fail(r, KWK_ERUNTIME, at, "comparison test needs an argument");
        *res = tv_eq(v, a0) == (id == T_EQ);
        return 0;
    case T_LT:
    case T_LE:
    case T_GT:
    case T_GE:
        if (!a0)
            return tpl_fail(r, KWK_ERUNTIME, at, "comparison test needs an argument");
        if ((rc = tv_cmp(r, at, v, a0, &c)))
            return rc;
        *res = id == T_LT ? c < 0 : id == T_LE ? c <= 0 : id == T_GT ? c > 0 : c >= 0;
        return 0;
    case T_IN: {
        if (!a0)
            return tpl_fail(r, KWK_ERUNTIME, at, "in test needs an argument");
        *res = 0;
        if (a0->k == TV_STR) {
            if (v->k != TV_STR)
                return tpl_fail(r, KWK_ERUNTIME, at, "'in <string>' requires string as left "
                                "operand");
            *res = !v->u.s.n || (v->u.s.n <= a0->u.s.n &&
                                 memmem(a0->u.s.p, a0->u.s.n, v->u.s.p, v->u.s.n));
        } else if (a0->k == TV_LIST) {
            for (size_t i = 0; i < a0->u.l->n && !*res; i++)
                *res = tv_eq(v, &a0->u.l->v[i]);
        } else if (a0->k == TV_DICT) {
            *res = td_get(a0->u.d, *v) != NULL;
        } else if (a0->k != TV_UNDEF) {
            return tpl_fail(r, KWK_ERUNTIME, at, "argument of type '%s' is not iterable",
                            tv_type_name(a0));
        }
        return 0;
    }
    case T_LOWER:
    case T_UPPER: {
        struct tv s, m;
        if ((rc = tv_to_str(r, v, &s)) || (rc = tpl_str_case(r, &s, id == T_LOWER ? 1 : 0, &m)))
            return rc;
        /* islower/isupper: has cased characters and is unchanged by the mapping. */
        struct tv other;
        if ((rc = tpl_str_case(r, &s, id == T_LOWER ? 0 : 1, &other)))
            return rc;
        *res = m.u.s.n == s.u.s.n && !memcmp(m.u.s.p, s.u.s.p, s.u.s.n) &&
               !(other.u.s.n == s.u.s.n && !memcmp(other.u.s.p, s.u.s.p, s.u.s.n));
        return 0;
    }
    case T_FILTER:
    case T_TEST:
        *res = v->k == TV_STR && (id == T_FILTER ? tpl_filter_id(v->u.s.p, v->u.s.n)
                                                 : tpl_test_id(v->u.s.p, v->u.s.n)) > 0;
        return 0;
    default:
        return tpl_fail(r, KWK_ERUNTIME, at, "no test named '%.*s'", at ? (int)at->sn : 0,
                        at ? at->s : "");
    }
}

/* ---- helpers ---- */

/* Attribute path "a.b.0" as jinja2's make_attrgetter follows it. */
static int attr_path(struct trender *r, const struct tnode *at, const struct tv *item,
                     const struct tv *path, struct tv *out)
{
    int rc;
    if (path->k == TV_INT)
        return tpl_getitem(r, at, item, path, out);
    if (path->k != TV_STR)
        return tpl_fail(r, KWK_ERUNTIME, at, "attribute name must be a string");
    struct tv cur = *item;
    const char *p = path->u.s.p, *end = p + path->u.s.n;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t n = dot ? (size_t)(dot - p) : (size_t)(end - p);
        int digits = n > 0;
        for (size_t i = 0; i < n; i++)
            digits &= p[i] >= '0' && p[i] <= '9';
        struct tv key;
        if (digits)
            key = tv_int(strtoll(p, NULL, 10));
        else
            key = tv_str(p, n);
        if (cur.k == TV_UNDEF)
            return tpl_undef_fail(r, at, &cur);
        if ((rc = tpl_getitem(r, at, &cur, &key, &cur)))
            return rc;
        if (!dot)
            break;
        p = dot + 1;
    }
    *out = cur;
    return 0;
}

static int lower_key(struct trender *r, const struct tv *v, int case_sensitive, struct tv *out)
{
    if (v->k == TV_STR && !case_sensitive)
        return tpl_str_case(r, v, 1, out);
    *out = *v;
    return 0;
}

/* Stable merge sort of idx[0..n) by keys (Python ordering); errors propagate. */
static int msort(struct trender *r, const struct tnode *at, const struct tv *keys, size_t *idx,
                 size_t *tmp, size_t n, int reverse)
{
    int rc;
    if (n < 2)
        return 0;
    size_t h = n / 2;
    if ((rc = msort(r, at, keys, idx, tmp, h, reverse)) ||
        (rc = msort(r, at, keys, idx + h, tmp, n - h, reverse)))
        return rc;
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c;
        if ((rc = tv_cmp(r, at, &keys[idx[j]], &keys[idx[i]], &c)))
            return rc;
        if (reverse)
            c = -c;
        /* take from the right only when strictly smaller: keeps equal items in order */
        tmp[k++] = c < 0 ? idx[j++] : idx[i++];
    }
    while (i < h)
        tmp[k++] = idx[i++];
    while (j < n)
        tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
    return tpl_step(r, at);
}

static int sort_list(struct trender *r, const struct tnode *at, const struct tlist *items,
                     const struct tv *keys, int reverse, struct tv *out)
{
    int rc;
    size_t n = items->n;
    size_t *idx = ta_alloc(r->a, (n + 1) * sizeof *idx), *tmp = ta_alloc(r->a, (n + 1) * sizeof *tmp);
    if (!idx || !tmp)
        return tpl_fail(r, KWK_ELIMIT, at, "template render ran out of its memory limit");
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    if ((rc = msort(r, at, keys, idx, tmp, n, reverse)) || (rc = tv_new_list(r, n, out)))
        return rc;
    for (size_t i = 0; i < n; i++)
        out->u.l->v[i] = items->v[idx[i]];
    out->u.l->n = n;
    return 0;
}

static int get_bool_arg(const struct tv *v, int dflt)
{
    return v ? tv_truthy(v) : dflt;
}

static int filter_sort(struct trender *r, const struct tnode *at, const struct tv *in,
                       const struct targs *a, struct tv *out)
{
    int reverse = get_bool_arg(targ(a, 0, "reverse"), 0);
    int cs = get_bool_arg(targ(a, 1, "case_sensitive"), 0);
    const struct tv *attr = targ(a, 2, "attribute");
    struct tlist *items;
    int rc;
    if ((rc = tv_iter(r, at, in, &items)))
        return rc;
    struct tv *keys = ta_alloc(r->a, (items->n + 1) * sizeof *keys);
    if (!keys)
        return tpl_fail(r, KWK_ELIMIT, at, "template render ran out of its memory limit");
    for (size_t i = 0; i < items->n; i++) {
        struct tv k = items->v[i];
        if (attr && attr->k != TV_NONE && (rc = attr_path(r, at, &items->v[i], attr, &k)))
            return rc;
        if ((rc = lower_key(r, &k, cs, &keys[i])))
            return rc;
    }
    return sort_list(r, at, items, keys, reverse, out);
}

static int filter_dictsort(struct trender *r, const struct tnode *at, const struct tv *in,
                           const struct targs *a, struct tv *out)
{
    int cs = get_bool_arg(targ(a, 0, "case_sensitive"), 0);
    const struct tv *by = targ(a, 1, "by");
    int reverse = get_bool_arg(targ(a, 2, "reverse"), 0);
    int pos = 0, rc;
    if (in->k != TV_DICT)
        return tpl_fail(r, KWK_ERUNTIME, at, "dictsort: expected a mapping");
    if (by && by->k == TV_STR) {
        if (by->u.s.n == 5 && !memcmp(by->u.s.p, "value", 5))
            pos = 1;
        else if (!(by->u.s.n == 3 && !memcmp(by->u.s.p, "key", 3)))
            return tpl_fail(r, KWK_ERUNTIME, at, "You can only sort by either \"key\" or "
                            "\"value\"");
    }
    struct tv items;
    if ((rc = tpl_dict_items(r, in->u.d, &items)))
        return rc;
    struct tv *keys = ta_alloc(r->a, (items.u.l->n + 1) * sizeof *keys);
    if (!keys)
        return tpl_fail(r, KWK_ELIMIT, at, "template render ran out of its memory limit");
    for (size_t i = 0; i < items.u.l->n; i++)
        if ((rc = lower_key(r, &items.u.l->v[i].u.l->v[pos], cs, &keys[i])))
            return rc;
    return sort_list(r, at, items.u.l, keys, reverse, out);
}

static int filter_unique(struct trender *r, const struct tnode *at, const struct tv *in,
                         const struct targs *a, struct tv *out)
{
    int cs = get_bool_arg(targ(a, 0, "case_sensitive"), 0);
    const struct tv *attr = targ(a, 1, "attribute");
    struct tlist *items;
    int rc;
    if ((rc = tv_iter(r, at, in, &items)) || (rc = tv_new_list(r, 0, out)))
        return rc;
    struct tv seen;
    if ((rc = tv_new_list(r, 0, &seen)))
        return rc;
    for (size_t i = 0; i < items->n; i++) {
        struct tv k = items->v[i], lk;
        if (attr && attr->k != TV_NONE && (rc = attr_path(r, at, &items->v[i], attr, &k)))
            return rc;
        if ((rc = lower_key(r, &k, cs, &lk)) || (rc = tpl_step(r, at)))
            return rc;
        int dup = 0;
        for (size_t j = 0; j < seen.u.l->n && !dup; j++)
            dup = tv_eq(&seen.u.l->v[j], &lk);
        if (dup)
            continue;
        if ((rc = tl_push(r, seen.u.l, lk)) || (rc = tl_push(r, out->u.l, items->v[i])))
            return rc;
    }
    return 0;
}

static int filter_minmax(struct trender *r, const struct tnode *at, const struct tv *in,
                         const struct targs *a, int want_max, struct tv *out)
{
    int cs = get_bool_arg(targ(a, 0, "case_sensitive"), 0);
    const struct tv *attr = targ(a, 1, "attribute");
    struct tlist *items;
    int rc;
    if ((rc = tv_iter(r, at, in, &items)))
        return rc;
    if (!items->n) {
        *out = tpl_undef(r, "No aggregated item, sequence was empty.");
        return 0;
    }
    struct tv best_key = tv_none();
    size_t best = 0;
    for (size_t i = 0; i < items->n; i++) {
        struct tv k = items->v[i], lk;
        int c;
        if (attr && attr->k != TV_NONE && (rc = attr_path(r, at, &items->v[i], attr, &k)))
            return rc;
        if ((rc = lower_key(r, &k, cs, &lk)))
            return rc;
        if (i) {
            if ((rc = tv_cmp(r, at, &lk, &best_key, &c)))
                return rc;
            if (!(want_max ? c > 0 : c < 0))
                continue;
        }
        best = i;
        best_key = lk;
    }
    *out = items->v[best];
    return 0;
}

/* select / reject / selectattr / rejectattr */
static int filter_select(struct trender *r, const struct tnode *at, const struct tv *in,
                         const struct targs *a, int with_attr, int keep, struct tv *out)
{
    struct tlist *items;
    int rc;
    size_t first = 0;
    const struct tv *attr = NULL;
    /* jinja2: "if value:" before iterating, so None or an empty value selects nothing */
    if (!tv_truthy(in))
        return tv_new_list(r, 0, out);
    if (with_attr) {
        if (!a->n_pos)
            return tpl_fail(r, KWK_ERUNTIME, at, "selectattr/rejectattr need an attribute");
        attr = &a->pos[0];
        first = 1;
    }
    int test = -1;
    if (a->n_pos > first) {
        const struct tv *tn = &a->pos[first];
        if (tn->k != TV_STR)
            return tpl_fail(r, KWK_ERUNTIME, at, "test name must be a string");
        test = tpl_test_id(tn->u.s.p, tn->u.s.n);
        if (test < 0)
            return tpl_fail(r, KWK_ERUNTIME, at, "No test named '%.*s'.", (int)tn->u.s.n,
                            tn->u.s.p);
    }
    if ((rc = tv_iter(r, at, in, &items)) || (rc = tv_new_list(r, 0, out)))
        return rc;
    for (size_t i = 0; i < items->n; i++) {
        struct tv v = items->v[i];
        int res;
        if (attr && (rc = attr_path(r, at, &items->v[i], attr, &v)))
            return rc;
        if (test < 0) {
            res = tv_truthy(&v);
        } else if ((rc = tpl_run_test(r, at, test, &v, a->pos + first + 1,
                                      a->n_pos - first - 1, &res))) {
            return rc;
        }
        if ((res != 0) == keep && (rc = tl_push(r, out->u.l, items->v[i])))
            return rc;
        if ((rc = tpl_step(r, at)))
            return rc;
    }
    return 0;
}

static int filter_map(struct trender *r, const struct tnode *at, const struct tv *in,
                      const struct targs *a, struct tv *out)
{
    struct tlist *items;
    int rc;
    const struct tv *attr = targ(a, SIZE_MAX, "attribute");
    const struct tv *dflt = targ(a, SIZE_MAX, "default");
    if (!tv_truthy(in))
        return tv_new_list(r, 0, out);
    if ((rc = tv_iter(r, at, in, &items)) || (rc = tv_new_list(r, items->n, out)))
        return rc;
    int fid = -1;
    struct targs rest = {0};
    if (!attr) {
        if (!a->n_pos || a->pos[0].k != TV_STR)
            return tpl_fail(r, KWK_ERUNTIME, at, "map needs a filter name or attribute=");
        fid = tpl_filter_id(a->pos[0].u.s.p, a->pos[0].u.s.n);
        if (fid < 0)
            return tpl_fail(r, KWK_ERUNTIME, at, "No filter named '%.*s'.",
                            (int)a->pos[0].u.s.n, a->pos[0].u.s.p);
        rest = *a;
        rest.pos++;
        rest.n_pos--;
    }
    for (size_t i = 0; i < items->n; i++) {
        struct tv v;
        if (attr) {
            if ((rc = attr_path(r, at, &items->v[i], attr, &v)))
                return rc;
            if (v.k == TV_UNDEF && dflt)
                v = *dflt;
        } else if ((rc = tpl_filter_run(r, at, fid, &items->v[i], &rest, &v))) {
            return rc;
        }
        out->u.l->v[out->u.l->n++] = v;
        if ((rc = tpl_step(r, at)))
            return rc;
    }
    return 0;
}

static int filter_indent(struct trender *r, const struct tnode *at, const struct tv *in,
                         const struct targs *a, struct tv *out)
{
    const struct tv *w = targ(a, 0, "width");
    int first = get_bool_arg(targ(a, 1, "first"), 0), blank = get_bool_arg(targ(a, 2, "blank"), 0);
    struct tv s, ind = tv_str("    ", 4);
    if (in->k != TV_STR)
        return tpl_fail(r, KWK_ERUNTIME, at, "indent: '%s' object has no attribute "
                        "'splitlines'", tv_type_name(in));
    s = *in;
    if (w && w->k == TV_STR) {
        ind = *w;
    } else if (w) {
        int64_t n;
        if (w->k != TV_INT && w->k != TV_BOOL)
            return tpl_fail(r, KWK_ERUNTIME, at, "indent width must be an integer or string");
        n = w->k == TV_INT ? w->u.i : w->u.b;
        if (n < 0)
            n = 0;
        if ((size_t)n > r->max_output)
            return tpl_fail(r, KWK_ELIMIT, at, "indent width too large");
        char *p = ta_alloc(r->a, (size_t)n + 1);
        if (!p)
            return tpl_fail(r, KWK_ELIMIT, at, "template render ran out of its memory limit");
        memset(p, ' ', (size_t)n);
        ind = tv_str(p, (size_t)n);
    }
    /* jinja2 appends "\n" then uses str.splitlines(), so a trailing newline survives. */
    struct tbuf b;
    tb_init(&b, r->max_output);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, st = 0, i = 0, line = 0;
    if (first)
        tb_put(&b, ind.u.s.p, ind.u.s.n);
    for (;;) {
        int at_end = i >= n;
        size_t l = 1;
        uint32_t cp = at_end ? '\n' : tu_decode(p + i, n - i, &l);
        int brk = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c ||
                  cp == 0x1d || cp == 0x1e || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (!brk) {
            i += l;
            continue;
        }
        size_t len = (at_end ? n : i) - st;
        if (line > 0) {
            tb_putc(&b, '\n');
            if (blank || len)
                tb_put(&b, ind.u.s.p, ind.u.s.n);
        }
        tb_put(&b, p + st, len);
        line++;
        if (at_end)
            break;
        i += l;
        if (cp == '\r' && i < n && p[i] == '\n')
            i++;
        st = i;
    }
    return tv_from_buf(r, &b, out);
}

static int filter_round(struct trender *r, const struct tnode *at, const struct tv *in,
                        const struct targs *a, struct tv *out)
{
    int64_t prec = 0;
    const struct tv *pv = targ(a, 0, "precision"), *mv = targ(a, 1, "method");
    if (pv && (pv->k == TV_INT || pv->k == TV_BOOL))
        prec = pv->k == TV_INT ? pv->u.i : pv->u.b;
    if (!tv_is_num(in))
        return tpl_fail(r, KWK_ERUNTIME, at, "round: expected a number, got %s",
                        tv_type_name(in));
    int method = 0; /* common */
    if (mv && mv->k == TV_STR) {
        if (mv->u.s.n == 4 && !memcmp(mv->u.s.p, "ceil", 4))
            method = 1;
        else if (mv->u.s.n == 5 && !memcmp(mv->u.s.p, "floor", 5))
            method = 2;
        else if (!(mv->u.s.n == 6 && !memcmp(mv->u.s.p, "common", 6)))
            return tpl_fail(r, KWK_ERUNTIME, at, "method must be common, ceil or floor");
    }
    if (prec > 300 || prec < -300)
        return tpl_fail(r, KWK_ERUNTIME, at, "round: precision out of range");
    double x = tv_num(in);
    if (method) {
        double f = pow(10.0, (double)prec);
        *out = tv_float((method == 1 ? ceil(x * f) : floor(x * f)) / f);
        return 0;
    }
    if (in->k != TV_FLOAT && prec >= 0) {
        *out = tv_int(in->k == TV_INT ? in->u.i : in->u.b);
        return 0;
    }
    /* Python's round(x, n): correctly rounded, ties to even; printf rounds the same way. */
    char buf[512];
    if (prec >= 0 && isfinite(x)) {
        snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
        *out = tv_float(strtod(buf, NULL));
    } else if (isfinite(x)) {
        double f = pow(10.0, (double)-prec);
        *out = tv_float(nearbyint(x / f) * f);
    } else {
        *out = tv_float(x);
    }
    return 0;
}

static int parse_pyint(const struct tv *s, int64_t *out)
{
    char buf[64];
    size_t n = 0;
    struct tv t;
    tpl_str_strip(s, NULL, 1, 1, &t);
    if (!t.u.s.n || t.u.s.n >= sizeof buf)
        return -1;
    for (size_t i = 0; i < t.u.s.n; i++) {
        char c = t.u.s.p[i];
        if (c == '_' && i > 0 && i + 1 < t.u.s.n)
            continue;
        if (!((c >= '0' && c <= '9') || ((c == '-' || c == '+') && i == 0)))
            return -1;
        buf[n++] = c;
    }
    buf[n] = 0;
    char *end;
    long long v = strtoll(buf, &end, 10);
    if (*end || end == buf)
        return -1;
    *out = v;
    return 0;
}

static int parse_pyfloat(const struct tv *s, double *out)
{
    char buf[128];
    struct tv t;
    tpl_str_strip(s, NULL, 1, 1, &t);
    if (!t.u.s.n || t.u.s.n >= sizeof buf)
        return -1;
    memcpy(buf, t.u.s.p, t.u.s.n);
    buf[t.u.s.n] = 0;
    char *end;
    double v = strtod(buf, &end);
    if (*end || end == buf)
        return -1;
    *out = v;
    return 0;
}

static int filter_join(struct trender *r, const struct tnode *at, const struct tv *in,
                       const struct targs *a, struct tv *out)
{
    const struct tv *sep = targ(a, 0, "d"), *attr = targ(a, 1, "attribute");
    struct tlist *items;
    struct tv sv = tv_str("", 0);
    int rc;
    if (sep && (rc = tv_to_str(r, sep, &sv)))
        return rc;
    if ((rc = tv_iter(r, at, in, &items)))
        return rc;
    struct tbuf b;
    tb_init(&b, r->max_output);
    for (size_t i = 0; i < items->n; i++) {
        struct tv v = items->v[i];
        if (attr && attr->k != TV_NONE && (rc = attr_path(r, at, &items->v[i], attr, &v)))
            break;
        if (i)
            tb_put(&b, sv.u.s.p, sv.u.s.n);
        if ((rc = tv_write_str(r, &b, &v)) || (rc = tpl_step(r, at)))
            break;
    }
    if (rc) {
        tb_free(&b);
        return rc;
    }
    return tv_from_buf(r, &b, out);
}

static int filter_tojson(struct trender *r, const struct tnode *at, const struct tv *in,
                         const struct targs *a, struct tv *out)
{
    /* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None,
     * sort_keys=False) over json.dumps. */
    const struct tv *ea = targ(a, 0, "ensure_ascii"), *ind = targ(a, 1, "indent");
    const struct tv *sep = targ(a, 2, "separators"), *sk = targ(a, 3, "sort_keys");
    struct tjson_opts o = {.ensure_ascii = ea ? tv_truthy(ea) : 0, .sort_keys = sk ? tv_truthy(sk) : 0};
    char *spaces = NULL;
    if (ind && ind->k != TV_NONE) {
        if (ind->k == TV_STR) {
            o.indent = ind->u.s.p;
            o.indent_n = ind->u.s.n;
        } else if (ind->k == TV_INT || ind->k == TV_BOOL) {
            int64_t n = ind->k == TV_INT ? ind->u.i : ind->u.b;
            if (n < 0)
                n = 0;
            if (n > 1000)
                return tpl_fail(r, KWK_ELIMIT, at, "tojson: indent too large");
            if (!(spaces = ta_alloc(r->a, (size_t)n + 1)))
                return tpl_fail(r, KWK_ELIMIT, at, "template render ran out of its memory limit");
            memset(spaces, ' ', (size_t)n);
            o.indent = spaces;
            o.indent_n = (size_t)n;
        } else {
            return tpl_fail(r, KWK_ERUNTIME, at, "tojson: indent must be an integer or string");
        }
    }
    o.item_sep = o.indent ? "," : ", ";
    o.key_sep = ": ";
    if (sep && sep->k != TV_NONE) {
        if (sep->k != TV_LIST || sep->u.l->n != 2 || sep->u.l->v[0].k != TV_STR ||
            sep->u.l->v[1].k != TV_STR)
            return tpl_fail(r, KWK_ERUNTIME, at, "tojson: separators must be two strings");
        char *s0 = ta_memdup(r->a, sep->u.l->v[0].u.s.p, sep->u.l->v[0].u.s.n);
        char *s1 = ta_memdup(r->a, sep->u.l->v[1].u.s.p, sep->u.l->v[1].u.s.n);
        if (!s0 || !s1)
            return tpl_fail(r, KWK_ELIMIT, at, "template render ran out of its memory limit");
        o.item_sep = s0;
        o.key_sep = s1;
    }
    struct tbuf b;
    tb_init(&b, r->max_output);
    int rc = tpl_tojson(r, at, &b, in, &o);
    if (rc) {
        tb_free(&b);
        return rc;
    }
    return tv_from_buf(r, &b, out);
}

static int filter_title(struct trender *r, const struct tv *s, struct tv *out)
{
    /* jinja2: words begin after runs of "-", whitespace, "(", "{", "[", "<". */
    struct tbuf b;
    tb_init(&b, r->max_output);
    int start = 1;
    for (size_t i = 0; i < s->u.s.n;) {
        size_t l;
        uint32_t cp = tu_decode(s->u.s.p + i, s->u.s.n - i, &l);
        int sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' ||
                  cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f) ||
                  cp == 0x85 || cp == 0xa0 || cp == 0x3000 || (cp >= 0x2000 && cp <= 0x200a);
        uint32_t m = cp;
        if (sep) {
            start = 1;
        } else {
            m = (uint32_t)(start ? utf8proc_toupper((utf8proc_int32_t)cp)
                                 : utf8proc_tolower((utf8proc_int32_t)cp));
            start = 0;
        }
        if (m == cp)
            tb_put(&b, s->u.s.p + i, l);
        else
            tb_put_cp(&b, m);
        i += l;
    }
    return tv_from_buf(r, &b, out);
}

int tpl_html_escape(struct trender *r, const struct tv *s, struct tv *out)
{
    struct tbuf b;
    tb_init(&b, r->max_output);
    for (size_t i = 0; i < s->u.s.n; i++) {
        char c = s->u.s.p[i];
        switch (c) {
        case '&': tb_puts(&b, "&amp;"); break;
        case '<': tb_puts(&b, "&lt;"); break;
        case '>': tb_puts(&b, "&gt;"); break;
        case '"': tb_puts(&b, "&#34;"); break;
        case '\'': tb_puts(&b, "&#39;"); break;
        default: tb_putc(&b, c);
        }
    }
    int rc = tv_from_buf(r, &b, out);
    if (!rc)
        out->flag |= TVF_SAFE;
    return rc;
}

static int filter_wordcount(const struct tv *s)
{
    int count = 0, in_word = 0;
    for (size_t i = 0; i < s->u.s.n;) {
        size_t l;
        uint32_t cp = tu_decode(s->u.s.p + i, s->u.s.n - i, &l);
        int cat = utf8proc_category((utf8proc_int32_t)cp);
        int w = cp == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO) ||
                (cat >= UTF8PROC_CATEGORY_MN && cat <= UTF8PROC_CATEGORY_ME);
        if (w && !in_word)
            count++;
        in_word = w;
        i += l;
    }
    return count;
}

static int filter_run(struct trender *r, const struct tnode *at, int id, const struct tv *in,
                      const struct targs *a, struct tv *out);

int tpl_filter_run(struct trender *r, const struct tnode *at, int id, const struct tv *in,
                   const struct targs *a, struct tv *out)
{
    int safe = in->k == TV_STR && (in->flag & TVF_SAFE);
    if (in->k == TV_STR)
        tpl_work += in->u.s.n / 16;
    else if (in->k == TV_LIST)
        tpl_work += in->u.l->n;
    int rc = filter_run(r, at, id, in, a, out);
    if (!rc && (rc = tpl_step(r, at)))
        return rc;
    /* jinja2 returns generators from these: always true, whatever they hold */
    if (!rc && r->dialect == TD_JINJA2 && out->k == TV_LIST &&
        (id == F_SELECT || id == F_REJECT || id == F_SELECTATTR || id == F_REJECTATTR ||
         id == F_MAP || id == F_ITEMS || id == F_BATCH || id == F_UNIQUE ||
         (id == F_REVERSE && in->k != TV_STR)))
        out->flag |= TVF_GEN;
    /* Markup stays Markup through jinja2's string filters. */
    if (!rc && safe && out->k == TV_STR &&
        (id == F_UPPER || id == F_LOWER || id == F_CAPITALIZE || id == F_TITLE || id == F_TRIM ||
         id == F_REPLACE || id == F_STRING))
        out->flag |= TVF_SAFE;
    return rc;
}

static int filter_run(struct trender *r, const struct tnode *at, int id, const struct tv *in,
                      const struct targs *a, struct tv *out)
{
    const struct tv *a0 = targ(a, 0, NULL), *a1 = targ(a, 1, NULL);
    struct tv s;
    struct tlist *items;
    int64_t n;
    int rc;
    switch (id) {
    case F_SAFE:
        if ((rc = tv_to_str(r, in, out)))
            return rc;
        out->flag |= TVF_SAFE;
        return 0;
    case F_STRING: return tv_to_str(r, in, out);
    case F_PPRINT: {
        struct tbuf b;
        tb_init(&b, r->max_output);
        if ((rc = tv_write_repr(r, &b, in))) {
            tb_free(&b);
            return rc;
        }
        return tv_from_buf(r, &b, out);
    }
    case F_TOJSON: return filter_tojson(r, at, in, a, out);
    case F_DEFAULT:
    case F_D: {
        const struct tv *dv = targ(a, 0, "default_value"), *bv = targ(a, 1, "boolean");
        int use = in->k == TV_UNDEF || (bv && tv_truthy(bv) && !tv_truthy(in));
        *out = use ? (dv ? *dv : tv_str("", 0)) : *in;
        return 0;
    }
    case F_LENGTH:
    case F_COUNT:
        if ((rc = tv_len(r, at, in, &n)))
            return rc;
        *out = tv_int(n);
        return 0;
    case F_UPPER:
    case F_LOWER:
    case F_CAPITALIZE:
        if ((rc = tv_to_str(r, in, &s)))
            return rc;
        return tpl_str_case(r, &s, id == F_UPPER ? 0 : id == F_LOWER ? 1 : 3, out);
    case F_TITLE:
        if ((rc = tv_to_str(r, in, &s)))
            return rc;
        return filter_title(r, &s, out);
    case F_TRIM:
        if ((rc = tv_to_str(r, in, &s)))
            return rc;
        return tpl_str_strip(&s, a0 && a0->k == TV_STR ? a0 : NULL, 1, 1, out);
    case F_E:
    case F_ESCAPE:
    case F_FORCEESCAPE:
        if (in->k == TV_STR && (in->flag & TVF_SAFE) && id != F_FORCEESCAPE) {
            *out = *in;
            return 0;
        }
        if ((rc = tv_to_str(r, in, &s)))
            return rc;
        return tpl_html_escape(r, &s, out);
    case F_REPLACE: {
        const struct tv *cnt = targ(a, 2, "count");
        struct tv o, nw;
        if (!a0 || !a1)
            return tpl_fail(r, KWK_ERUNTIME, at, "replace needs two arguments");
        if ((rc = tv_to_str(r, in, &s)) || (rc = tv_to_str(r, a0, &o)) ||
            (rc = tv_to_str(r, a1, &nw)))
            return rc;
        n = -1;
        if (cnt && cnt->k == TV_INT)
            n = cnt->u.i;
        return tpl_str_replace(r, at, &s, &o, &nw, n, out);
    }
    case F_FIRST:
    case F_LAST:
        if ((rc = tv_iter(r, at, in, &items)))
            return rc;
        if (!items->n)
            *out = tpl_undef(r, "No %s item, sequence was empty.", id == F_FIRST ? "first" :
                             "last");
        else
            *out = items->v[id == F_FIRST ? 0 : items->n - 1];
        return 0;
    case F_LIST:
        if ((rc = tv_iter(r, at, in, &items)) || (rc = tv_new_list(r, items->n, out)))
            return rc;
        if (items->n)
            memcpy(out->u.l->v, items->v, items->n * sizeof(struct tv));
        out->u.l->n = items->n;
        return 0;
    case F_REVERSE:
        if (in->k == TV_STR) {
            struct tv neg = tv_int(-1), none = tv_none();
            return tpl_slice(r, at, in, &none, &none, &neg, out);
        }
        if ((rc = tv_iter(r, at, in, &items)) || (rc = tv_new_list(r, items->n, out)))
            return rc;
        for (size_t i = 0; i < items->n; i++)
            out->u.l->v[i] = items->v[items->n - 1 - i];
        out->u.l->n = items->n;
        return 0;
    case F_JOIN: return filter_join(r, at, in, a, out);
    case F_ITEMS:
        if (in->k == TV_UNDEF)
            return tv_new_list(r, 0, out);
        if (in->k != TV_DICT)
            return tpl_fail(r, KWK_ERUNTIME, at, "Can only get item pairs from a mapping.");
        return tpl_dict_items(r, in->u.d, out);
    case F_MAP: return filter_map(r, at, in, a, out);
    case F_SELECT: return filter_select(r, at, in, a, 0, 1, out);
    case F_REJECT: return filter_select(r, at, in, a, 0, 0, out);
    case F_SELECTATTR: return filter_select(r, at, in, a, 1, 1, out);
    case F_REJECTATTR: return filter_select(r, at, in, a, 1, 0, out);
    case F_UNIQUE: return filter_unique(r, at, in, a, out);
    case F_SORT: return filter_sort(r, at, in, a, out);
    case F_DICTSORT: return filter_dictsort(r, at, in, a, out);
    case F_MIN: return filter_minmax(r, at, in, a, 0, out);
    case F_MAX: return filter_minmax(r, at, in, a, 1, out);
    case F_INDENT: return filter_indent(r, at, in, a, out);
    case F_ROUND: return filter_round(r, at, in, a, out);
    case F_ABS:
        if (in->k == TV_FLOAT)
            *out = tv_float(fabs(in->u.f));
        else if (in->k == TV_INT || in->k == TV_BOOL) {
            n = in->k == TV_INT ? in->u.i : in->u.b;
            if (n == INT64_MIN)
                return tpl_fail(r, KWK_ERUNTIME, at, "integer overflow");
            *out = tv_int(n < 0 ? -n : n);
        } else {
            return tpl_fail(r, KWK_ERUNTIME, at, "bad operand type for abs(): '%s'",
                            tv_type_name(in));
        }
        return 0;
    case F_INT: {
        const struct tv *dv = targ(a, 0, "default");
        if (in->k == TV_UNDEF)
            return tpl_undef_fail(r, at, in); /* int(Undefined) raises in jinja2 */
        struct tv dflt = dv ? *dv : tv_int(0);
        double f;
        if (in->k == TV_INT || in->k == TV_BOOL)
            *out = tv_int(in->k == TV_INT ? in->u.i : in->u.b);
        else if (in->k == TV_FLOAT)
            *out = isfinite(in->u.f) && fabs(in->u.f) < 9.2e18 ? tv_int((int64_t)in->u.f) : dflt;
        else if (in->k == TV_STR && !parse_pyint(in, &n))
            *out = tv_int(n);
        else if (in->k == TV_STR && !parse_pyfloat(in, &f) && isfinite(f) && fabs(f) < 9.2e18)
            *out = tv_int((int64_t)f);
        else
            *out = dflt;
        return 0;
    }
    case F_FLOAT: {
        const struct tv *dv = targ(a, 0, "default");
        if (in->k == TV_UNDEF)
            return tpl_undef_fail(r, at, in);
        double f;
        if (tv_is_num(in))
            *out = tv_float(tv_num(in));
        else if (in->k == TV_STR && !parse_pyfloat(in, &f))
            *out = tv_float(f);
        else
            *out = dv ? *dv : tv_float(0.0);
        return 0;
    }
    case F_SUM: {
        const struct tv *attr = targ(a, 0, "attribute"), *start = targ(a, 1, "start");
        struct tv acc = start ? *start : tv_int(0);
        if ((rc = tv_iter(r, at, in, &items)))
            return rc;
        for (size_t i = 0; i < items->n; i++) {
            struct tv v = items->v[i];
            if (attr && attr->k != TV_NONE && (rc = attr_path(r, at, &items->v[i], attr, &v)))
                return rc;
            if (!tv_is_num(&acc) || !tv_is_num(&v))
                return tpl_fail(r, KWK_ERUNTIME, at, "sum: unsupported operand types");
            if (acc.k == TV_FLOAT || v.k == TV_FLOAT)
                acc = tv_float(tv_num(&acc) + tv_num(&v));
            else if (__builtin_add_overflow(acc.k == TV_INT ? acc.u.i : acc.u.b,
                                            v.k == TV_INT ? v.u.i : v.u.b, &n))
                return tpl_fail(r, KWK_ERUNTIME, at, "integer overflow");
            else
                acc = tv_int(n);
        }
        *out = acc;
        return 0;
    }
    case F_BATCH: {
        const struct tv *fill = targ(a, 1, "fill_with");
        if (!a0 || (a0->k != TV_INT) || a0->u.i <= 0)
            return tpl_fail(r, KWK_ERUNTIME, at, "batch needs a positive count");
        if ((rc = tv_iter(r, at, in, &items)) || (rc = tv_new_list(r, 0, out)))
            return rc;
        size_t per = (size_t)a0->u.i;
        for (size_t i = 0; i < items->n; i += per) {
            struct tv chunk;
            if ((rc = tv_new_list(r, per < items->n ? per : items->n, &chunk)))
                return rc;
            for (size_t j = i; j < i + per && j < items->n; j++)
                if ((rc = tl_push(r, chunk.u.l, items->v[j])))
                    return rc;
            while (fill && fill->k != TV_NONE && chunk.u.l->n < per)
                if ((rc = tl_push(r, chunk.u.l, *fill)) || (rc = tpl_step(r, at)))
                    return rc;
            if ((rc = tl_push(r, out->u.l, chunk)))
                return rc;
        }
        return 0;
    }
    case F_WORDCOUNT:
        if ((rc = tv_to_str(r, in, &s)))
            return rc;
        *out = tv_int(filter_wordcount(&s));
        return 0;
    case F_ATTR:
        if (!a0 || a0->k != TV_STR)
            return tpl_fail(r, KWK_ERUNTIME, at, "attr needs a name");
        return tpl_getattr(r, at, in, a0->u.s.p, a0->u.s.n, out);
    case F_CENTER: {
        int64_t w = 80;
        if (a0 && (a0->k == TV_INT))
            w = a0->u.i;
        if ((rc = tv_to_str(r, in, &s)))
            return rc;
        int64_t len = (int64_t)tu_count(s.u.s.p, s.u.s.n);
        if (w > (int64_t)r->max_output)
            return tpl_fail(r, KWK_ELIMIT, at, "center width too large");
        if (w <= len) {
            *out = s;
            return 0;
        }
        /* Python str.center: extra space goes left when the margin is odd and width odd */
        int64_t marg = w - len, left = marg / 2 + (marg & w & 1);
        struct tbuf b;
        tb_init(&b, r->max_output);
        for (int64_t i = 0; i < left; i++)
            tb_putc(&b, ' ');
        tb_put(&b, s.u.s.p, s.u.s.n);
        for (int64_t i = 0; i < marg - left; i++)
            tb_putc(&b, ' ');
        return tv_from_buf(r, &b, out);
    }
    case F_FORMAT: {
        struct tv args;
        if ((rc = tv_to_str(r, in, &s)))
            return rc;
        if (a->n_kw) {
            if ((rc = tv_new_dict(r, a->n_kw, &args)))
                return rc;
            for (size_t i = 0; i < a->n_kw; i++) {
                struct tv k;
                if ((rc = tv_str_copy(r, a->kw_names[i].p, a->kw_names[i].n, &k)) ||
                    (rc = td_set(r, args.u.d, k, a->kw[i])))
                    return rc;
            }
        } else {
            if ((rc = tv_new_list(r, a->n_pos, &args)))
                return rc;
            if (a->n_pos)
                memcpy(args.u.l->v, a->pos, a->n_pos * sizeof(struct tv));
            args.u.l->n = a->n_pos;
            args.flag = TVF_TUPLE;
        }
        return tpl_percent_format(r, at, &s, &args, out);
    }
    default:
        return tpl_fail(r, KWK_ERUNTIME, at, "No filter named '%.*s'.", at ? (int)at->sn : 0,
                        at ? at->s : "");
    }
}
