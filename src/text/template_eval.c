/* template_eval.c - the tree-walking evaluator: scopes, expressions with Python semantics,
 * statements (if, for, set, macro, call, filter blocks) and the step/depth/output limits.
 * One render is driven by one thread; the tree it walks is shared read-only. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "text/template.h"

struct tvar {
    int sym;
    struct tv v;
};

struct tscope {
    struct tscope *parent;
    struct tvar *v;
    size_t n, cap;
};

int tpl_fail(struct trender *r, int code, const struct tnode *at, const char *fmt, ...)
{
    if (r->err && r->err->code)
        return r->err->code;
    char msg[KWK_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) {
        kwk_err_set(r->err, code, "%s (template line %d)", msg, at->line);
        if (r->err) {
            r->err->line = at->line;
            r->err->col = at->col;
        }
    } else {
        kwk_err_set(r->err, code, "%s", msg);
    }
    return code;
}

_Thread_local uint64_t tpl_work TPL_TLS_FAST;

int tpl_step(struct trender *r, const struct tnode *at)
{
    r->steps += 1 + tpl_work;
    tpl_work = 0;
    if (r->steps > r->max_steps)
        return tpl_fail(r, KWK_ELIMIT, at, "template exceeded its step limit (%llu steps)",
                        (unsigned long long)r->max_steps);
    return 0;
}

struct tv tpl_undef(struct trender *r, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof msg)
        n = sizeof msg - 1;
    char *p = ta_memdup(r->a, msg, (size_t)n);
    return tv_undef(p, p ? (size_t)n : 0);
}

int tpl_undef_fail(struct trender *r, const struct tnode *at, const struct tv *u)
{
    if (u->k == TV_UNDEF && u->id == TU_NAME)
        return tpl_fail(r, KWK_ERUNTIME, at, "'%.*s' is undefined",
                        (int)KWK_MIN(u->u.s.n, (size_t)100), u->u.s.p);
    if (u->k == TV_UNDEF && u->id >= TU_ATTR)
        return tpl_fail(r, KWK_ERUNTIME, at, "'%s' has no attribute '%.*s'",
                        tpl_undef_desc(u->id - TU_ATTR), (int)KWK_MIN(u->u.s.n, (size_t)100),
                        u->u.s.p);
    if (u->k == TV_UNDEF && u->u.s.p)
        return tpl_fail(r, KWK_ERUNTIME, at, "%s", u->u.s.p);
    return tpl_fail(r, KWK_ERUNTIME, at, "value is undefined");
}

/* ---- scopes ---- */

static struct tscope *scope_new(struct trender *r, struct tscope *parent)
{
    struct tscope *s = ta_alloc(r->a, sizeof *s);
    if (s)
        s->parent = parent;
    else
        tpl_fail(r, KWK_ELIMIT, NULL, "template render ran out of its memory limit");
    return s;
}

static int scope_set(struct trender *r, struct tscope *s, int sym, struct tv v)
{
    for (size_t i = 0; i < s->n; i++) {
        if (s->v[i].sym == sym) {
            s->v[i].v = v;
            return 0;
        }
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        struct tvar *nv = ta_alloc(r->a, cap * sizeof *nv);
        if (!nv)
            return tpl_fail(r, KWK_ELIMIT, NULL, "template render ran out of its memory limit");
        if (s->n)
            memcpy(nv, s->v, s->n * sizeof *nv);
        s->v = nv;
        s->cap = cap;
    }
    s->v[s->n].sym = sym;
    s->v[s->n].v = v;
    s->n++;
    return 0;
}

static const struct tv *scope_get(const struct tscope *s, int sym)
{
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (s->v[i].sym == sym)
                return &s->v[i].v;
    return NULL;
}

/* ---- output ---- */

static int out_check(struct trender *r, const struct tnode *at)
{
    if (r->out->err)
        return tpl_fail(r, r->out->err == KWK_ELIMIT ? KWK_ELIMIT : r->out->err, at,
                        "template output exceeds its size limit (%zu bytes)", r->max_output);
    return 0;
}

static int capture(struct trender *r, struct tscope *sc, const struct tnode *body, struct tv *out)
{
    struct tbuf buf, *saved = r->out;
    tb_init(&buf, r->max_output);
    r->out = &buf;
    int rc = tpl_exec(r, sc, body);
    r->out = saved;
    if (!rc && buf.err)
        rc = tpl_fail(r, KWK_ELIMIT, body, "template output exceeds its size limit (%zu bytes)",
                      r->max_output);
    if (rc) {
        tb_free(&buf);
        return rc;
    }
    return tv_from_buf(r, &buf, out);
}

/* ---- expressions ---- */

/* Calls with *args / **kwargs: append the expanded values to the evaluated arguments. */
static int eval_star_args(struct trender *r, struct tscope *sc, const struct tnode *n,
                          struct targs *a)
{
    struct tv v;
    struct tlist *items;
    int rc;
    if (n->c) {
        if ((rc = tpl_eval(r, sc, n->c, &v)) || (rc = tv_iter(r, n, &v, &items)))
            return rc;
        struct tv *pos = ta_alloc(r->a, (a->n_pos + items->n + 1) * sizeof *pos);
        if (!pos)
            return tpl_fail(r, KWK_ELIMIT, n, "template render ran out of its memory limit");
        if (a->n_pos)
            memcpy(pos, a->pos, a->n_pos * sizeof *pos);
        if (items->n)
            memcpy(pos + a->n_pos, items->v, items->n * sizeof *pos);
        a->pos = pos;
        a->n_pos += items->n;
    }
    if (n->d) {
        if ((rc = tpl_eval(r, sc, n->d, &v)))
            return rc;
        if (v.k != TV_DICT)
            return tpl_fail(r, KWK_ERUNTIME, n, "argument after ** must be a mapping, not %s",
                            tv_type_name(&v));
        size_t total = a->n_kw + v.u.d->n;
        struct tv *kw = ta_alloc(r->a, (total + 1) * sizeof *kw);
        struct tname *names = ta_alloc(r->a, (total + 1) * sizeof *names);
        if (!kw || !names)
            return tpl_fail(r, KWK_ELIMIT, n, "template render ran out of its memory limit");
        if (a->n_kw) {
            memcpy(kw, a->kw, a->n_kw * sizeof *kw);
            memcpy(names, a->kw_names, a->n_kw * sizeof *names);
        }
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (v.u.d->keys[i].k != TV_STR)
                return tpl_fail(r, KWK_ERUNTIME, n, "keywords must be strings");
            names[a->n_kw + i].p = v.u.d->keys[i].u.s.p;
            names[a->n_kw + i].n = v.u.d->keys[i].u.s.n;
            names[a->n_kw + i].sym = -1;
            kw[a->n_kw + i] = v.u.d->vals[i];
        }
        a->kw = kw;
        a->kw_names = names;
        a->n_kw = total;
    }
    return 0;
}

int tpl_eval_args(struct trender *r, struct tscope *sc, const struct tnode *n, struct targs *a)
{
    int rc;
    memset(a, 0, sizeof *a);
    if (n->n_kids) {
        if (!(a->pos = ta_alloc(r->a, n->n_kids * sizeof(struct tv))))
            return tpl_fail(r, KWK_ELIMIT, n, "template render ran out of its memory limit");
        for (size_t i = 0; i < n->n_kids; i++)
            if ((rc = tpl_eval(r, sc, n->kids[i], &a->pos[i])))
                return rc;
        a->n_pos = n->n_kids;
    }
    if (n->n_names && n->kind != E_TEST) {
        if (!(a->kw = ta_alloc(r->a, n->n_names * sizeof(struct tv))))
            return tpl_fail(r, KWK_ELIMIT, n, "template render ran out of its memory limit");
        for (size_t i = 0; i < n->n_names; i++)
            if ((rc = tpl_eval(r, sc, n->kids2[i], &a->kw[i])))
                return rc;
        a->kw_names = n->names;
        a->n_kw = n->n_names;
    }
    if (n->c || n->d)
        return eval_star_args(r, sc, n, a);
    return 0;
}

static int int_result(struct trender *r, const struct tnode *at, int overflow, int64_t v,
                      struct tv *out)
{
    if (overflow)
        return tpl_fail(r, KWK_ERUNTIME, at, "integer overflow");
    *out = tv_int(v);
    return 0;
}

static int repeat(struct trender *r, const struct tnode *at, const struct tv *seq, int64_t times,
                  struct tv *out)
{
    int rc;
    if (times < 0)
        times = 0;
    if (seq->k == TV_STR) {
        size_t total;
        if (kwk_mul_size(seq->u.s.n, (size_t)times, &total) || total > r->max_output)
            return tpl_fail(r, KWK_ELIMIT, at, "string repetition exceeds the output limit");
        char *p = ta_alloc(r->a, total + 1);
        if (!p)
            return tpl_fail(r, KWK_ELIMIT, at, "template render ran out of its memory limit");
        for (int64_t i = 0; i < times; i++)
            memcpy(p + (size_t)i * seq->u.s.n, seq->u.s.p, seq->u.s.n);
        *out = tv_str(p, total);
        return 0;
    }
    size_t total;
    if (kwk_mul_size(seq->u.l->n, (size_t)times, &total) || total > r->max_steps)
        return tpl_fail(r, KWK_ELIMIT, at, "list repetition exceeds the step limit");
    if ((rc = tv_new_list(r, total, out)))
        return rc;
    for (int64_t i = 0; i < times; i++)
        for (size_t j = 0; j < seq->u.l->n; j++)
            out->u.l->v[out->u.l->n++] = seq->u.l->v[j];
    out->flag = seq->flag;
    return 0;
}

static int concat(struct trender *r, const struct tnode *at, const struct tv *a,
                  const struct tv *b, struct tv *out)
{
    size_t n;
    tpl_work += (a->u.s.n + b->u.s.n) / 64;
    if (kwk_add_size(a->u.s.n, b->u.s.n, &n) || n > r->max_output)
        return tpl_fail(r, KWK_ELIMIT, at, "string exceeds the output limit");
    char *p = ta_alloc(r->a, n + 1);
    if (!p)
        return tpl_fail(r, KWK_ELIMIT, at, "template render ran out of its memory limit");
    memcpy(p, a->u.s.p, a->u.s.n);
    memcpy(p + a->u.s.n, b->u.s.p, b->u.s.n);
    *out = tv_str(p, n);
    return 0;
}

static const char *op_name(int op)
{
    switch (op) {
    case OP_ADD: return "+";
    case OP_SUB: return "-";
    case OP_MUL: return "*";
    case OP_DIV: return "/";
    case OP_FLOORDIV: return "//";
    case OP_MOD: return "%";
    case OP_POW: return "**";
    default: return "~";
    }
}

static int arith(struct trender *r, const struct tnode *at, int op, const struct tv *a,
                 const struct tv *b, struct tv *out)
{
    int rc;
    if (op == OP_CONCAT) {
        struct tv sa, sb;
        if ((rc = tv_to_str(r, a, &sa)) || (rc = tv_to_str(r, b, &sb)))
            return rc;
        return concat(r, at, &sa, &sb, out);
    }
    if (a->k == TV_UNDEF || b->k == TV_UNDEF)
        return tpl_undef_fail(r, at, a->k == TV_UNDEF ? a : b);
    if (op == OP_MOD && a->k == TV_STR)
        return tpl_percent_format(r, at, a, b, out);
    if (tv_is_num(a) && tv_is_num(b)) {
        int fl = a->k == TV_FLOAT || b->k == TV_FLOAT;
        int64_t x = a->k == TV_INT ? a->u.i : a->k == TV_BOOL ? a->u.b : 0;
        int64_t y = b->k == TV_INT ? b->u.i : b->k == TV_BOOL ? b->u.b : 0;
        double fx = tv_num(a), fy = tv_num(b);
        int64_t res = 0;
        switch (op) {
        case OP_ADD:
            if (fl)
                break;
            {
                int ovf = __builtin_add_overflow(x, y, &res);
                return int_result(r, at, ovf, res, out);
            }
        case OP_SUB:
            if (fl)
                break;
            {
                int ovf = __builtin_sub_overflow(x, y, &res);
                return int_result(r, at, ovf, res, out);
            }
        case OP_MUL:
            if (fl)
                break;
            {
                int ovf = __builtin_mul_overflow(x, y, &res);
                return int_result(r, at, ovf, res, out);
            }
        case OP_DIV:
            if (fy == 0.0)
                return tpl_fail(r, KWK_ERUNTIME, at, "division by zero");
            *out = tv_float(fx / fy);
            return 0;
        case OP_FLOORDIV:
        case OP_MOD:
            if ((fl && fy == 0.0) || (!fl && y == 0))
                return tpl_fail(r, KWK_ERUNTIME, at, op == OP_MOD ? "modulo by zero" :
                                "integer division or modulo by zero");
            if (fl) {
                double m = fmod(fx, fy);
                if (m != 0.0 && ((m < 0) != (fy < 0)))
                    m += fy;
                *out = tv_float(op == OP_MOD ? m : floor(fx / fy));
                return 0;
            }
            if (x == INT64_MIN && y == -1)
                return tpl_fail(r, KWK_ERUNTIME, at, "integer overflow");
            {
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q -= 1;
                    m += y;
                }
                *out = tv_int(op == OP_MOD ? m : q);
            }
            return 0;
        case OP_POW:
            if (!fl && y >= 0) {
                int64_t acc = 1, base = x;
                int64_t e = y;
                int ovf = 0;
                while (e > 0 && !ovf) {
                    if (e & 1)
                        ovf |= __builtin_mul_overflow(acc, base, &acc);
                    e >>= 1;
                    if (e)
                        ovf |= __builtin_mul_overflow(base, base, &base);
                }
                return int_result(r, at, ovf, acc, out);
            }
            if (fx == 0.0 && fy < 0)
                return tpl_fail(r, KWK_ERUNTIME, at, "0.0 cannot be raised to a negative power");
            *out = tv_float(pow(fx, fy));
            return 0;
        }
        switch (op) {
        case OP_ADD: *out = tv_float(fx + fy); return 0;
        case OP_SUB: *out = tv_float(fx - fy); return 0;
        case OP_MUL: *out = tv_float(fx * fy); return 0;
        }
    }
    if (op == OP_ADD && a->k == TV_STR && b->k == TV_STR) {
        if (!((a->flag | b->flag) & TVF_SAFE))
            return concat(r, at, a, b, out);
        /* Markup + str escapes the plain side (markupsafe) and stays Markup. */
        struct tv ea = *a, eb = *b;
        if ((!(a->flag & TVF_SAFE) && (rc = tpl_html_escape(r, a, &ea))) ||
            (!(b->flag & TVF_SAFE) && (rc = tpl_html_escape(r, b, &eb))) ||
            (rc = concat(r, at, &ea, &eb, out)))
            return rc;
        out->flag |= TVF_SAFE;
        return 0;
    }
    if (op == OP_ADD && r->dialect == TD_HFJS && (a->k == TV_STR || b->k == TV_STR)) {
        struct tv sa, sb;
        if ((rc = tv_to_str(r, a, &sa)) || (rc = tv_to_str(r, b, &sb)))
            return rc;
        return concat(r, at, &sa, &sb, out);
    }
    if (op == OP_ADD && a->k == TV_LIST && b->k == TV_LIST &&
        (a->flag & TVF_TUPLE) == (b->flag & TVF_TUPLE) &&
        !((a->flag | b->flag) & (TVF_RANGE | TVF_GEN))) {
        size_t n;
        if (kwk_add_size(a->u.l->n, b->u.l->n, &n))
            return tpl_fail(r, KWK_ELIMIT, at, "list too long");
        if ((rc = tv_new_list(r, n, out)))
            return rc;
        if (a->u.l->n)
            memcpy(out->u.l->v, a->u.l->v, a->u.l->n * sizeof(struct tv));
        if (b->u.l->n)
            memcpy(out->u.l->v + a->u.l->n, b->u.l->v, b->u.l->n * sizeof(struct tv));
        out->u.l->n = n;
        out->flag = a->flag;
        return tpl_step(r, at);
    }
    if ((a->k == TV_LIST && (a->flag & (TVF_GEN | TVF_RANGE))) ||
        (b->k == TV_LIST && (b->flag & (TVF_GEN | TVF_RANGE))))
        return tpl_fail(r, KWK_ERUNTIME, at, "unsupported operand type(s) for %s: '%s' and '%s'",
                        op_name(op), tv_type_name(a), tv_type_name(b));
    if (op == OP_MUL && (a->k == TV_STR || a->k == TV_LIST) && (b->k == TV_INT || b->k == TV_BOOL))
        return repeat(r, at, a, b->k == TV_INT ? b->u.i : b->u.b, out);
    if (op == OP_MUL && (b->k == TV_STR || b->k == TV_LIST) && (a->k == TV_INT || a->k == TV_BOOL))
        return repeat(r, at, b, a->k == TV_INT ? a->u.i : a->u.b, out);
    if (op == OP_ADD && a->k == TV_STR)
        return tpl_fail(r, KWK_ERUNTIME, at, "can only concatenate str (not \"%s\") to str",
                        tv_type_name(b));
    if (op == OP_ADD && a->k == TV_LIST)
        return tpl_fail(r, KWK_ERUNTIME, at, "can only concatenate list (not \"%s\") to list",
                        b->flag & TVF_RANGE ? "range" : b->flag & TVF_GEN ? "generator"
                        : tv_type_name(b));
    return tpl_fail(r, KWK_ERUNTIME, at, "unsupported operand type(s) for %s: '%s' and '%s'",
                    op_name(op), tv_type_name(a), tv_type_name(b));
}

static int contains(struct trender *r, const struct tnode *at, const struct tv *item,
                    const struct tv *seq, int *res)
{
    *res = 0;
    switch (seq->k) {
    case TV_UNDEF: return 0;
    case TV_STR:
        if (item->k != TV_STR)
            return tpl_fail(r, KWK_ERUNTIME, at,
                            "'in <string>' requires string as left operand, not %s",
                            tv_type_name(item));
        if (!item->u.s.n) {
            *res = 1;
        } else if (item->u.s.n <= seq->u.s.n) {
            *res = memmem(seq->u.s.p, seq->u.s.n, item->u.s.p, item->u.s.n) != NULL;
        }
        return 0;
    case TV_LIST:
        for (size_t i = 0; i < seq->u.l->n; i++)
            if (tv_eq(item, &seq->u.l->v[i]) &&
                (r->dialect != TD_HFJS || (item->k == TV_BOOL) == (seq->u.l->v[i].k == TV_BOOL))) {
                *res = 1;
                break;
            }
        return 0;
    case TV_DICT:
    case TV_NS:
        if ((item->k == TV_LIST && !(item->flag & (TVF_TUPLE | TVF_RANGE))) || item->k == TV_DICT ||
            item->k == TV_NS)
            return tpl_fail(r, KWK_ERUNTIME, at, "unhashable type: '%s'", tv_type_name(item));
        *res = td_get(seq->u.d, *item) != NULL;
        return 0;
    default:
        return tpl_fail(r, KWK_ERUNTIME, at, "argument of type '%s' is not iterable",
                        tv_type_name(seq));
    }
}

static int eval_compare(struct trender *r, struct tscope *sc, const struct tnode *n, struct tv *v)
{
    struct tv left, right;
    int rc;
    if ((rc = tpl_eval(r, sc, n->a, &left)))
        return rc;
    for (size_t i = 0; i < n->n_kids; i++) {
        if ((rc = tpl_eval(r, sc, n->kids[i], &right)))
            return rc;
        int ok = 0, c;
        switch (n->ops[i]) {
        case CMP_EQ: ok = tv_eq(&left, &right); break;
        case CMP_NE: ok = !tv_eq(&left, &right); break;
        case CMP_IN:
        case CMP_NOTIN:
            if ((rc = contains(r, n, &left, &right, &ok)))
                return rc;
            if (n->ops[i] == CMP_NOTIN)
                ok = !ok;
            break;
        default:
            if ((rc = tv_cmp(r, n, &left, &right, &c)))
                return rc;
            ok = n->ops[i] == CMP_LT ? c < 0 : n->ops[i] == CMP_LE ? c <= 0
                 : n->ops[i] == CMP_GT ? c > 0 : c >= 0;
        }
        if (!ok) {
            *v = tv_bool(0);
            return 0;
        }
        left = right;
    }
    *v = tv_bool(1);
    return 0;
}

static int eval_call(struct trender *r, struct tscope *sc, const struct tnode *n,
                     struct tmacro *caller, struct tv *v)
{
    struct tv fn;
    struct targs args;
    int rc;
    if ((rc = tpl_eval(r, sc, n->a, &fn)) || (rc = tpl_eval_args(r, sc, n, &args)))
        return rc;
    args.caller = caller;
    switch (fn.k) {
    case TV_MACRO: return tpl_call_macro(r, n, fn.u.m, &args, v);
    case TV_BUILTIN: return tpl_call_builtin(r, n, (int)fn.id, &args, v);
    case TV_METHOD: return tpl_call_method(r, n, fn.u.bm, &args, v);
    case TV_UNDEF: return tpl_undef_fail(r, n, &fn);
    default:
        return tpl_fail(r, KWK_ERUNTIME, n, "'%s' object is not callable", tv_type_name(&fn));
    }
}

static int eval_filter(struct trender *r, struct tscope *sc, const struct tnode *n,
                       const struct tv *src, struct tv *v)
{
    struct tv in;
    struct targs args;
    int rc;
    if (n->a) {
        if ((rc = tpl_eval(r, sc, n->a, &in)))
            return rc;
    } else if (src) {
        in = *src;
    } else {
        in = tv_undef(NULL, 0);
    }
    if ((rc = tpl_eval_args(r, sc, n, &args)))
        return rc;
    return tpl_filter_run(r, n, n->op, &in, &args, v);
}

/* A filter chain whose innermost source is src (filter blocks, set blocks). */
static int eval_filter_chain(struct trender *r, struct tscope *sc, const struct tnode *n,
                             const struct tv *src, struct tv *v)
{
    int rc;
    if (!n->a)
        return eval_filter(r, sc, n, src, v);
    struct tv inner;
    if ((rc = eval_filter_chain(r, sc, n->a, src, &inner)))
        return rc;
    struct targs args;
    if ((rc = tpl_eval_args(r, sc, n, &args)))
        return rc;
    return tpl_filter_run(r, n, n->op, &inner, &args, v);
}

static int eval_test(struct trender *r, struct tscope *sc, const struct tnode *n, struct tv *v)
{
    struct tv in;
    struct targs args;
    int rc, res;
    if ((rc = tpl_eval(r, sc, n->a, &in)) || (rc = tpl_eval_args(r, sc, n, &args)))
        return rc;
    if ((rc = tpl_run_test(r, n, n->op, &in, args.pos, args.n_pos, &res)))
        return rc;
    *v = tv_bool(n->neg ? !res : res);
    return 0;
}

static int eval_name(struct trender *r, struct tscope *sc, const struct tnode *n, struct tv *v)
{
    const struct tv *x = scope_get(sc, n->sym);
    if (x) {
        *v = *x;
        return 0;
    }
    int id = tpl_builtin_id(n->s, n->sn);
    if (id) {
        memset(v, 0, sizeof *v);
        v->k = TV_BUILTIN;
        v->id = (uint32_t)id;
        return 0;
    }
    *v = tv_undef_lazy(TU_NAME, n->s, n->sn);
    return 0;
}

static int eval_seq(struct trender *r, struct tscope *sc, const struct tnode *n, struct tv *v)
{
    int rc;
    if (n->kind == E_DICT) {
        if ((rc = tv_new_dict(r, n->n_kids / 2, v)))
            return rc;
        for (size_t i = 0; i + 1 < n->n_kids; i += 2) {
            struct tv k, x;
            if ((rc = tpl_eval(r, sc, n->kids[i], &k)) ||
                (rc = tpl_eval(r, sc, n->kids[i + 1], &x)) || (rc = td_set(r, v->u.d, k, x)))
                return rc;
        }
        return 0;
    }
    if ((rc = tv_new_list(r, n->n_kids, v)))
        return rc;
    for (size_t i = 0; i < n->n_kids; i++) {
        if ((rc = tpl_eval(r, sc, n->kids[i], &v->u.l->v[i])))
            return rc;
        v->u.l->n++;
    }
    if (n->kind == E_TUPLE)
        v->flag = TVF_TUPLE;
    return 0;
}

static int eval_node(struct trender *r, struct tscope *sc, const struct tnode *n, struct tv *v);

int tpl_eval(struct trender *r, struct tscope *sc, const struct tnode *n, struct tv *v)
{
    int rc;
    if ((rc = tpl_step(r, n)))
        return rc;
    if (++r->nest > TPL_MAX_NEST) {
        r->nest--;
        return tpl_fail(r, KWK_ELIMIT, n, "template nests too deeply (recursion limit)");
    }
    rc = eval_node(r, sc, n, v);
    r->nest--;
    return rc;
}

/* Whether jinja2's optimizer folds this expression at compile time. */
static int const_expr(const struct tnode *n)
{
    switch (n->kind) {
    case E_CONST: return 1;
    case E_NEG:
    case E_POS:
    case E_NOT: return const_expr(n->a);
    case E_BINOP: return const_expr(n->a) && const_expr(n->b);
    default: return 0;
    }
}

static int eval_node(struct trender *r, struct tscope *sc, const struct tnode *n, struct tv *v)
{
    struct tv a, b;
    int rc;
    switch (n->kind) {
    case E_CONST: *v = n->val; return 0;
    case E_NAME: return eval_name(r, sc, n, v);
    case E_LIST:
    case E_TUPLE:
    case E_DICT: return eval_seq(r, sc, n, v);
    case E_GETATTR:
        if ((rc = tpl_eval(r, sc, n->a, &a)))
            return rc;
        return tpl_getattr(r, n, &a, n->s, n->sn, v);
    case E_GETITEM:
        if ((rc = tpl_eval(r, sc, n->a, &a)))
            return rc;
        if (n->b->kind == E_SLICE) {
            struct tv parts[3];
            const struct tnode *pn[3] = {n->b->a, n->b->b, n->b->c};
            for (int i = 0; i < 3; i++) {
                parts[i] = tv_none();
                if (pn[i] && (rc = tpl_eval(r, sc, pn[i], &parts[i])))
                    return rc;
            }
            return tpl_slice(r, n, &a, &parts[0], &parts[1], &parts[2], v);
        }
        if ((rc = tpl_eval(r, sc, n->b, &b)))
            return rc;
        return tpl_getitem(r, n, &a, &b, v);
    case E_CALL: return eval_call(r, sc, n, NULL, v);
    case E_FILTER: return eval_filter(r, sc, n, NULL, v);
    case E_TEST: return eval_test(r, sc, n, v);
    case E_NOT:
        if ((rc = tpl_eval(r, sc, n->a, &a)))
            return rc;
        *v = tv_bool(!tv_truthy(&a));
        return 0;
    case E_NEG:
    case E_POS:
        if ((rc = tpl_eval(r, sc, n->a, &a)))
            return rc;
        if (a.k == TV_UNDEF)
            return tpl_undef_fail(r, n, &a);
        if (!tv_is_num(&a))
            return tpl_fail(r, KWK_ERUNTIME, n, "bad operand type for unary %c: '%s'",
                            n->kind == E_NEG ? '-' : '+', tv_type_name(&a));
        if (a.k == TV_FLOAT)
            *v = tv_float(n->kind == E_NEG ? -a.u.f : a.u.f);
        else if (n->kind == E_POS)
            *v = tv_int(a.k == TV_INT ? a.u.i : a.u.b);
        else
            return int_result(r, n, a.k == TV_INT && a.u.i == INT64_MIN,
                              -(a.k == TV_INT ? a.u.i : a.u.b), v);
        return 0;
    case E_BINOP:
        if ((rc = tpl_eval(r, sc, n->a, &a)) || (rc = tpl_eval(r, sc, n->b, &b)))
            return rc;
        if (n->op == OP_POW && n->a->kind == E_NEG && n->a->a->kind == E_CONST &&
            tv_is_num(&n->a->a->val) && !const_expr(n->b)) {
            /* jinja2 folds -2 into a constant and, when the exponent is not constant too,
             * emits Python source "(-2 ** y)", which Python reads as -(2 ** y). */
            struct tv pos = n->a->a->val, p;
            if ((rc = arith(r, n, OP_POW, &pos, &b, &p)))
                return rc;
            if (p.k == TV_FLOAT)
                *v = tv_float(-p.u.f);
            else
                return int_result(r, n, p.u.i == INT64_MIN, -p.u.i, v);
            return 0;
        }
        return arith(r, n, n->op, &a, &b, v);
    case E_COMPARE: return eval_compare(r, sc, n, v);
    case E_AND:
    case E_OR:
        if ((rc = tpl_eval(r, sc, n->a, &a)))
            return rc;
        if (tv_truthy(&a) == (n->kind == E_OR)) {
            *v = a;
            return 0;
        }
        return tpl_eval(r, sc, n->b, v);
    case E_COND:
        if ((rc = tpl_eval(r, sc, n->a, &a)))
            return rc;
        if (tv_truthy(&a))
            return tpl_eval(r, sc, n->b, v);
        if (n->c)
            return tpl_eval(r, sc, n->c, v);
        *v = tpl_undef(r, "the inline if-expression evaluated to false and no else section "
                          "was defined.");
        return 0;
    default: return tpl_fail(r, KWK_ERUNTIME, n, "cannot evaluate this node");
    }
}

/* ---- statements ---- */

static int assign(struct trender *r, struct tscope *sc, const struct tnode *target,
                  const struct tname *names, size_t n_names, int unpack, struct tv v)
{
    int rc;
    if (target && target->kind == E_GETATTR) {
        const struct tv *ns = scope_get(sc, target->a->sym);
        if (!ns || ns->k != TV_NS)
            return tpl_fail(r, KWK_ERUNTIME, target,
                            "cannot assign attribute on non-namespace object");
        if (target->sn && target->s[0] == '_')
            return tpl_fail(r, KWK_ERUNTIME, target, "chat templates cannot store "
                            "underscore-prefixed attributes on a namespace");
        struct tv key;
        if ((rc = tv_str_copy(r, target->s, target->sn, &key)))
            return rc;
        return td_set(r, ns->u.d, key, v);
    }
    if (!unpack)
        return scope_set(r, sc, names[0].sym, v);
    struct tlist *items;
    if ((rc = tv_iter(r, target, &v, &items)))
        return rc;
    if (items->n != n_names)
        return tpl_fail(r, KWK_ERUNTIME, target, items->n > n_names ?
                        "too many values to unpack (expected %zu)" :
                        "not enough values to unpack (expected %zu)", n_names);
    for (size_t i = 0; i < n_names; i++)
        if ((rc = scope_set(r, sc, names[i].sym, items->v[i])))
            return rc;
    return 0;
}

static int loop_sym_cache(struct trender *r)
{
    if (r->sym_loop == -2)
        r->sym_loop = tsyms_find(r->syms, "loop", 4);
    return r->sym_loop;
}

static int exec_for(struct trender *r, struct tscope *sc, const struct tnode *n)
{
    struct tv it;
    struct tlist *items;
    int rc;
    if ((rc = tpl_eval(r, sc, n->a, &it)) || (rc = tv_iter(r, n->a, &it, &items)))
        return rc;
    if (n->d) {
        /* "for x in xs if cond": filter first, so loop.length counts what remains. */
        struct tv kept;
        if ((rc = tv_new_list(r, items->n, &kept)))
            return rc;
        for (size_t i = 0; i < items->n; i++) {
            struct tscope *fs = scope_new(r, sc);
            struct tv c;
            if (!fs)
                return KWK_ELIMIT;
            if ((rc = assign(r, fs, n, n->names, n->n_names, n->neg, items->v[i])) ||
                (rc = tpl_eval(r, fs, n->d, &c)))
                return rc;
            if (tv_truthy(&c))
                kept.u.l->v[kept.u.l->n++] = items->v[i];
        }
        items = kept.u.l;
    }
    size_t count = items->n;
    int completed = 0; /* jinja2 runs the else block unless some body ran to its end */
    if (!count)
        return n->c ? tpl_exec(r, sc, n->c) : 0;
    struct tloop *lp = ta_alloc(r->a, sizeof *lp);
    if (!lp)
        return tpl_fail(r, KWK_ELIMIT, n, "template render ran out of its memory limit");
    lp->items = items;
    struct tv loopv = {.k = TV_LOOP};
    loopv.u.lp = lp;
    int loop_sym = loop_sym_cache(r);
    for (size_t i = 0; i < count; i++) {
        struct tscope *body = scope_new(r, sc);
        if (!body)
            return KWK_ELIMIT;
        lp->i = i;
        if ((rc = assign(r, body, n, n->names, n->n_names, n->neg, items->v[i])))
            return rc;
        if (loop_sym >= 0 && (rc = scope_set(r, body, loop_sym, loopv)))
            return rc;
        if ((rc = tpl_exec(r, body, n->b)))
            return rc;
        if (!r->ctl)
            completed = 1;
        if (r->ctl == 1) {
            r->ctl = 0;
            break;
        }
        r->ctl = 0;
    }
    return !completed && n->c ? tpl_exec(r, sc, n->c) : 0;
}

int tpl_loop_attr(struct trender *r, const struct tnode *at, const struct tv *loop,
                  const char *name, size_t n, struct tv *out)
{
    const struct tloop *lp = loop->u.lp;
    int64_t i = (int64_t)lp->i, len = (int64_t)lp->items->n;
#define IS(s) (n == sizeof(s) - 1 && !memcmp(name, s, n))
    if (IS("index"))
        *out = tv_int(i + 1);
    else if (IS("index0"))
        *out = tv_int(i);
    else if (IS("revindex"))
        *out = tv_int(len - i);
    else if (IS("revindex0"))
        *out = tv_int(len - i - 1);
    else if (IS("first"))
        *out = tv_bool(i == 0);
    else if (IS("last"))
        *out = tv_bool(i == len - 1);
    else if (IS("length"))
        *out = tv_int(len);
    else if (IS("depth"))
        *out = tv_int(1);
    else if (IS("depth0"))
        *out = tv_int(0);
    else if (IS("previtem"))
        *out = i > 0 ? lp->items->v[i - 1] : tpl_undef(r, "there is no previous item");
    else if (IS("nextitem"))
        *out = i + 1 < len ? lp->items->v[i + 1] : tpl_undef(r, "there is no next item");
    else
        *out = tpl_undef(r, "'LoopContext object' has no attribute '%.*s'", (int)n, name);
#undef IS
    return 0;
}

int tpl_loop_cycle(struct trender *r, const struct tnode *at, const struct tv *loop,
                   const struct targs *args, struct tv *out)
{
    if (!args->n_pos)
        return tpl_fail(r, KWK_ERUNTIME, at, "no items for cycling given");
    *out = args->pos[loop->u.lp->i % args->n_pos];
    return 0;
}

int tpl_call_macro(struct trender *r, const struct tnode *at, struct tmacro *m,
                   const struct targs *args, struct tv *out)
{
    const struct tnode *def = m->def;
    int rc;
    if (r->depth >= r->max_depth)
        return tpl_fail(r, KWK_ELIMIT, at, "template exceeded its recursion depth limit (%d)",
                        r->max_depth);
    struct tscope *sc = scope_new(r, m->closure);
    if (!sc)
        return KWK_ELIMIT;
    struct tv varargs, kwargs;
    if ((rc = tv_new_list(r, 0, &varargs)) || (rc = tv_new_dict(r, 0, &kwargs)))
        return rc;
    varargs.flag = TVF_TUPLE;
    for (size_t i = 0; i < args->n_pos; i++) {
        if (i < def->n_names) {
            if ((rc = scope_set(r, sc, def->names[i].sym, args->pos[i])))
                return rc;
        } else if ((rc = tl_push(r, varargs.u.l, args->pos[i]))) {
            return rc;
        }
    }
    for (size_t k = 0; k < args->n_kw; k++) {
        size_t j;
        for (j = 0; j < def->n_names; j++)
            if (def->names[j].n == args->kw_names[k].n &&
                !memcmp(def->names[j].p, args->kw_names[k].p, def->names[j].n))
                break;
        if (j < def->n_names) {
            if (j < args->n_pos)
                return tpl_fail(r, KWK_ERUNTIME, at, "macro got multiple values for argument "
                                "'%.*s'", (int)def->names[j].n, def->names[j].p);
            if ((rc = scope_set(r, sc, def->names[j].sym, args->kw[k])))
                return rc;
        } else {
            struct tv key;
            if ((rc = tv_str_copy(r, args->kw_names[k].p, args->kw_names[k].n, &key)) ||
                (rc = td_set(r, kwargs.u.d, key, args->kw[k])))
                return rc;
        }
    }
    for (size_t j = 0; j < def->n_names; j++) {
        int bound = j < args->n_pos;
        for (size_t k = 0; !bound && k < args->n_kw; k++)
            bound = def->names[j].n == args->kw_names[k].n &&
                    !memcmp(def->names[j].p, args->kw_names[k].p, def->names[j].n);
        if (bound)
            continue;
        struct tv dv;
        if (def->kids && def->kids[j]) {
            if ((rc = tpl_eval(r, sc, def->kids[j], &dv)))
                return rc;
        } else {
            dv = tpl_undef(r, "parameter '%.*s' was not provided", (int)def->names[j].n,
                           def->names[j].p);
        }
        if ((rc = scope_set(r, sc, def->names[j].sym, dv)))
            return rc;
    }
    int s_var = tsyms_find(r->syms, "varargs", 7), s_kw = tsyms_find(r->syms, "kwargs", 6);
    int s_caller = tsyms_find(r->syms, "caller", 6);
    if ((s_var >= 0 && (rc = scope_set(r, sc, s_var, varargs))) ||
        (s_kw >= 0 && (rc = scope_set(r, sc, s_kw, kwargs))))
        return rc;
    if (args->caller && s_caller >= 0) {
        struct tv cv = {.k = TV_MACRO};
        cv.u.m = args->caller;
        if ((rc = scope_set(r, sc, s_caller, cv)))
            return rc;
    }
    r->depth++;
    rc = capture(r, sc, def->b, out);
    r->depth--;
    return rc;
}

static int exec_node(struct trender *r, struct tscope *sc, const struct tnode *n)
{
    struct tv v;
    int rc;
    switch (n->kind) {
    case N_BODY:
        for (size_t i = 0; i < n->n_kids && !r->ctl; i++)
            if ((rc = tpl_exec(r, sc, n->kids[i])))
                return rc;
        return 0;
    case N_TEXT:
        tb_put(r->out, n->s, n->sn);
        return out_check(r, n);
    case N_OUTPUT:
        if ((rc = tpl_eval(r, sc, n->a, &v)) || (rc = tv_write_str(r, r->out, &v)))
            return rc;
        return out_check(r, n);
    case N_IF:
        if ((rc = tpl_eval(r, sc, n->a, &v)))
            return rc;
        if (tv_truthy(&v))
            return tpl_exec(r, sc, n->b);
        return n->c ? tpl_exec(r, sc, n->c) : 0;
    case N_FOR:
        if (r->depth >= r->max_depth)
            return tpl_fail(r, KWK_ELIMIT, n, "template nests too deeply");
        r->depth++;
        rc = exec_for(r, sc, n);
        r->depth--;
        return rc;
    case N_SET:
        if ((rc = tpl_eval(r, sc, n->b, &v)))
            return rc;
        return assign(r, sc, n->a, n->a->names, n->a->n_names, n->a->kind == E_TUPLE, v);
    case N_SET_BLOCK:
        if ((rc = capture(r, sc, n->b, &v)))
            return rc;
        if (n->d && (rc = eval_filter_chain(r, sc, n->d, &v, &v)))
            return rc;
        return assign(r, sc, n->a, n->a->names, n->a->n_names, n->a->kind == E_TUPLE, v);
    case N_MACRO: {
        struct tmacro *m = ta_alloc(r->a, sizeof *m);
        if (!m)
            return tpl_fail(r, KWK_ELIMIT, n, "template render ran out of its memory limit");
        m->def = n;
        m->closure = sc;
        v = (struct tv){.k = TV_MACRO};
        v.u.m = m;
        return scope_set(r, sc, n->sym, v);
    }
    case N_CALL_BLOCK: {
        struct tmacro *m = ta_alloc(r->a, sizeof *m);
        if (!m)
            return tpl_fail(r, KWK_ELIMIT, n, "template render ran out of its memory limit");
        m->def = n;
        m->closure = sc;
        if ((rc = eval_call(r, sc, n->a, m, &v)) || (rc = tv_write_str(r, r->out, &v)))
            return rc;
        return out_check(r, n);
    }
    case N_FILTER_BLOCK:
        if ((rc = capture(r, sc, n->b, &v)) || (rc = eval_filter_chain(r, sc, n->a, &v, &v)) ||
            (rc = tv_write_str(r, r->out, &v)))
            return rc;
        return out_check(r, n);
    case N_BREAK: r->ctl = 1; return 0;
    case N_CONTINUE: r->ctl = 2; return 0;
    default: return tpl_fail(r, KWK_ERUNTIME, n, "cannot execute this node");
    }
}

int tpl_exec(struct trender *r, struct tscope *sc, const struct tnode *n)
{
    int rc = tpl_step(r, n);
    if (rc)
        return rc;
    if (++r->nest > TPL_MAX_NEST) {
        r->nest--;
        return tpl_fail(r, KWK_ELIMIT, n, "template nests too deeply (recursion limit)");
    }
    rc = exec_node(r, sc, n);
    r->nest--;
    return rc;
}

int tpl_render_root(struct trender *r, const struct tnode *root, const struct tv *context)
{
    struct tscope *g = scope_new(r, NULL);
    int rc;
    if (!g)
        return KWK_ELIMIT;
    if (context && context->k == TV_DICT) {
        const struct tdict *d = context->u.d;
        for (size_t i = 0; i < d->n; i++) {
            if (d->keys[i].k != TV_STR)
                continue;
            int sym = tsyms_find(r->syms, d->keys[i].u.s.p, d->keys[i].u.s.n);
            if (sym >= 0 && (rc = scope_set(r, g, sym, d->vals[i])))
                return rc;
        }
    }
    r->globals = g;
    /* Top-level statements write to a child scope so the context itself stays as given. */
    struct tscope *top = scope_new(r, g);
    if (!top)
        return KWK_ELIMIT;
    return tpl_exec(r, top, root);
}
