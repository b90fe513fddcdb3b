/* template_parse.c - the Jinja parser: tokens to a syntax tree, following jinja2's grammar and
 * operator precedence (jinja2/parser.py). Pure function of its inputs; any thread. */
#include <stdio.h>
#include <string.h>

#include "text/template.h"

struct parser {
    const struct ttoken *t;
    size_t n, i;
    struct tarena *a;
    struct tsyms *syms;
    struct kwk_err *err;
    int depth;
    int in_loop;
};

#define PARSE_MAX_DEPTH 200

static struct tnode *parse_expr(struct parser *P);
static struct tnode *parse_or(struct parser *P);
static struct tnode *parse_unary(struct parser *P, int with_filter);
static struct tnode *parse_tuple(struct parser *P, int with_condexpr, const char *extra_end,
                                 int explicit_parens);
static struct tnode *parse_body(struct parser *P, const char *const *ends, int *which);

int tsyms_find(const struct tsyms *s, const char *p, size_t n)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i].n == n && !memcmp(s->v[i].p, p, n))
            return (int)i;
    return -1;
}

int tsyms_intern(struct tsyms *s, struct tarena *a, const char *p, size_t n)
{
    int id = tsyms_find(s, p, n);
    if (id >= 0)
        return id;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        struct tname *v = ta_alloc(a, cap * sizeof *v);
        if (!v)
            return -1;
        if (s->n)
            memcpy(v, s->v, s->n * sizeof *v);
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n].p = p;
    s->v[s->n].n = n;
    s->v[s->n].sym = (int)s->n;
    return (int)s->n++;
}

static const struct ttoken *cur(struct parser *P)
{
    return &P->t[P->i];
}

static const struct ttoken *peek(struct parser *P, size_t k)
{
    size_t j = P->i + k;
    return &P->t[j < P->n ? j : P->n - 1];
}

static void advance(struct parser *P)
{
    if (P->i + 1 < P->n)
        P->i++;
}

static int tok_is(const struct ttoken *t, int type, const char *text)
{
    if (t->type != type)
        return 0;
    if (!text)
        return 1;
    size_t l = strlen(text);
    return t->n == l && !memcmp(t->p, text, l);
}

static int is_op(struct parser *P, const char *op)
{
    return tok_is(cur(P), TK_OP, op);
}

static int is_name(struct parser *P, const char *name)
{
    return tok_is(cur(P), TK_NAME, name);
}

static void *pfail(struct parser *P, const char *fmt, const char *arg)
{
    if (P->err && P->err->code)
        return NULL;
    const struct ttoken *t = cur(P);
    char what[64];
    if (t->type == TK_EOF)
        snprintf(what, sizeof what, "end of template");
    else if (t->type == TK_BLOCK_END || t->type == TK_VAR_END)
        snprintf(what, sizeof what, "end of tag");
    else
        snprintf(what, sizeof what, "'%.*s'", (int)KWK_MIN(t->n, (size_t)40), t->p);
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");
    kwk_err_set(P->err, KWK_ESYNTAX, "template syntax error at line %d, column %d: %s (at %s)",
                t->line, t->col, msg, what);
    if (P->err) {
        P->err->line = t->line;
        P->err->col = t->col;
    }
    return NULL;
}

static struct tnode *node_new(struct parser *P, int kind, const struct ttoken *at)
{
    struct tnode *n = ta_alloc(P->a, sizeof *n);
    if (!n) {
        kwk_err_set(P->err, KWK_ELIMIT, "template too large");
        return NULL;
    }
    n->kind = kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

/* A small vector of node pointers while parsing a list. */
struct nvec {
    struct tnode **v;
    size_t n, cap;
};

static int nvec_push(struct parser *P, struct nvec *v, struct tnode *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        struct tnode **nv = ta_alloc(P->a, cap * sizeof *nv);
        if (!nv) {
            kwk_err_set(P->err, KWK_ELIMIT, "template too large");
            return -1;
        }
        if (v->n)
            memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return 0;
}

struct namevec {
    struct tname *v;
    size_t n, cap;
};

static int names_push(struct parser *P, struct namevec *v, const char *p, size_t n)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        struct tname *nv = ta_alloc(P->a, cap * sizeof *nv);
        if (!nv) {
            kwk_err_set(P->err, KWK_ELIMIT, "template too large");
            return -1;
        }
        if (v->n)
            memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    int sym = tsyms_intern(P->syms, P->a, p, n);
    if (sym < 0) {
        kwk_err_set(P->err, KWK_ELIMIT, "template too large");
        return -1;
    }
    v->v[v->n].p = p;
    v->v[v->n].n = n;
    v->v[v->n].sym = sym;
    v->n++;
    return 0;
}

static int expect_op(struct parser *P, const char *op)
{
    if (!is_op(P, op)) {
        pfail(P, "expected '%s'", op);
        return -1;
    }
    advance(P);
    return 0;
}

static int expect_block_end(struct parser *P)
{
    if (cur(P)->type != TK_BLOCK_END) {
        pfail(P, "expected end of statement block%s", NULL);
        return -1;
    }
    advance(P);
    return 0;
}

/* Call arguments after '(' (the current token). */
static int parse_call_args(struct parser *P, struct tnode *call)
{
    struct nvec pos = {0}, kw = {0};
    struct namevec kwn = {0};
    if (expect_op(P, "("))
        return -1;
    while (!is_op(P, ")")) {
        if (pos.n + kw.n || call->c || call->d) {
            if (expect_op(P, ","))
                return -1;
            if (is_op(P, ")"))
                break;
        }
        if (is_op(P, "*") || is_op(P, "**")) {
            int kw_star = is_op(P, "**");
            if ((kw_star && call->d) || (!kw_star && call->c)) {
                pfail(P, "repeated * or ** argument%s", NULL);
                return -1;
            }
            advance(P);
            struct tnode *e = parse_expr(P);
            if (!e)
                return -1;
            if (kw_star)
                call->d = e;
            else
                call->c = e;
            continue;
        }
        if (cur(P)->type == TK_NAME && tok_is(peek(P, 1), TK_OP, "=")) {
            const struct ttoken *nt = cur(P);
            advance(P);
            advance(P);
            struct tnode *v = parse_expr(P);
            if (!v || names_push(P, &kwn, nt->p, nt->n) || nvec_push(P, &kw, v))
                return -1;
        } else {
            if (kw.n) {
                pfail(P, "positional argument after keyword argument%s", NULL);
                return -1;
            }
            struct tnode *v = parse_expr(P);
            if (!v || nvec_push(P, &pos, v))
                return -1;
        }
    }
    advance(P);
    call->kids = pos.v;
    call->n_kids = pos.n;
    call->kids2 = kw.v;
    call->names = kwn.v;
    call->n_names = kwn.n;
    return 0;
}

static struct tnode *parse_subscribed(struct parser *P)
{
    const struct ttoken *at = cur(P);
    struct tnode *parts[3] = {NULL, NULL, NULL};
    if (is_op(P, ":")) {
        advance(P);
    } else {
        struct tnode *e = parse_expr(P);
        if (!e || !is_op(P, ":"))
            return e;
        advance(P);
        parts[0] = e;
    }
    if (!is_op(P, ":") && !is_op(P, "]") && !is_op(P, ",")) {
        if (!(parts[1] = parse_expr(P)))
            return NULL;
    }
    if (is_op(P, ":")) {
        advance(P);
        if (!is_op(P, "]") && !is_op(P, ",")) {
            if (!(parts[2] = parse_expr(P)))
                return NULL;
        }
    }
    struct tnode *s = node_new(P, E_SLICE, at);
    if (!s)
        return NULL;
    s->a = parts[0];
    s->b = parts[1];
    s->c = parts[2];
    return s;
}

static struct tnode *parse_postfix(struct parser *P, struct tnode *node)
{
    while (node) {
        const struct ttoken *at = cur(P);
        if (is_op(P, ".")) {
            advance(P);
            const struct ttoken *t = cur(P);
            if (t->type == TK_NAME) {
                struct tnode *g = node_new(P, E_GETATTR, at);
                if (!g)
                    return NULL;
                g->a = node;
                g->s = t->p;
                g->sn = t->n;
                advance(P);
                node = g;
            } else if (t->type == TK_INT) {
                struct tnode *g = node_new(P, E_GETITEM, at), *k = node_new(P, E_CONST, t);
                if (!g || !k)
                    return NULL;
                k->val = tv_int(t->ival);
                g->a = node;
                g->b = k;
                advance(P);
                node = g;
            } else {
                return pfail(P, "expected name or number after '.'%s", NULL);
            }
        } else if (is_op(P, "[")) {
            advance(P);
            struct nvec idx = {0};
            while (!is_op(P, "]")) {
                if (idx.n) {
                    if (expect_op(P, ","))
                        return NULL;
                    if (is_op(P, "]"))
                        break;
                }
                struct tnode *e = parse_subscribed(P);
                if (!e || nvec_push(P, &idx, e))
                    return NULL;
            }
            advance(P);
            if (!idx.n)
                return pfail(P, "expected subscript expression%s", NULL);
            struct tnode *g = node_new(P, E_GETITEM, at);
            if (!g)
                return NULL;
            g->a = node;
            if (idx.n == 1) {
                g->b = idx.v[0];
            } else {
                struct tnode *tup = node_new(P, E_TUPLE, at);
                if (!tup)
                    return NULL;
                tup->kids = idx.v;
                tup->n_kids = idx.n;
                g->b = tup;
            }
            node = g;
        } else if (is_op(P, "(")) {
            struct tnode *c = node_new(P, E_CALL, at);
            if (!c)
                return NULL;
            c->a = node;
            if (parse_call_args(P, c))
                return NULL;
            node = c;
        } else {
            break;
        }
    }
    return node;
}

static struct tnode *parse_primary(struct parser *P)
{
    const struct ttoken *t = cur(P);
    struct tnode *n;
    if (++P->depth > PARSE_MAX_DEPTH) {
        kwk_err_set(P->err, KWK_ELIMIT, "template nests expressions too deeply (line %d)",
                    t->line);
        return NULL;
    }
    switch (t->type) {
    case TK_NAME:
        if (!(n = node_new(P, E_CONST, t)))
            break;
        if (tok_is(t, TK_NAME, "true") || tok_is(t, TK_NAME, "True")) {
            n->val = tv_bool(1);
        } else if (tok_is(t, TK_NAME, "false") || tok_is(t, TK_NAME, "False")) {
            n->val = tv_bool(0);
        } else if (tok_is(t, TK_NAME, "none") || tok_is(t, TK_NAME, "None")) {
            n->val = tv_none();
        } else {
            n->kind = E_NAME;
            n->s = t->p;
            n->sn = t->n;
            n->sym = tsyms_intern(P->syms, P->a, t->p, t->n);
            if (n->sym < 0) {
                n = NULL;
                kwk_err_set(P->err, KWK_ELIMIT, "template too large");
                break;
            }
        }
        advance(P);
        break;
    case TK_STRING: {
        if (!(n = node_new(P, E_CONST, t)))
            break;
        /* Adjacent string literals concatenate, as in Python. */
        if (cur(P)->type == TK_STRING && peek(P, 1)->type == TK_STRING) {
            struct tbuf b;
            tb_init(&b, 0);
            while (cur(P)->type == TK_STRING) {
                tb_put(&b, cur(P)->p, cur(P)->n);
                advance(P);
            }
            char *s = b.err ? NULL : ta_memdup(P->a, b.p ? b.p : "", b.n);
            n->val = tv_str(s, b.n);
            tb_free(&b);
            if (!s) {
                kwk_err_set(P->err, KWK_ELIMIT, "template too large");
                n = NULL;
            }
        } else {
            n->val = tv_str(t->p, t->n);
            advance(P);
        }
        break;
    }
    case TK_INT:
    case TK_FLOAT:
        if (!(n = node_new(P, E_CONST, t)))
            break;
        n->val = t->type == TK_INT ? tv_int(t->ival) : tv_float(t->fval);
        advance(P);
        break;
    case TK_OP:
        if (is_op(P, "(")) {
            advance(P);
            n = parse_tuple(P, 1, NULL, 1);
            if (n && expect_op(P, ")"))
                n = NULL;
        } else if (is_op(P, "[")) {
            advance(P);
            struct nvec items = {0};
            n = node_new(P, E_LIST, t);
            while (n && !is_op(P, "]")) {
                if (items.n) {
                    if (expect_op(P, ",")) {
                        n = NULL;
                        break;
                    }
                    if (is_op(P, "]"))
                        break;
                }
                struct tnode *e = parse_expr(P);
                if (!e || nvec_push(P, &items, e))
                    n = NULL;
            }
            if (n) {
                advance(P);
                n->kids = items.v;
                n->n_kids = items.n;
            }
        } else if (is_op(P, "{")) {
            advance(P);
            struct nvec items = {0};
            n = node_new(P, E_DICT, t);
            while (n && !is_op(P, "}")) {
                if (items.n) {
                    if (expect_op(P, ",")) {
                        n = NULL;
                        break;
                    }
                    if (is_op(P, "}"))
                        break;
                }
                struct tnode *k = parse_expr(P);
                if (!k || expect_op(P, ":")) {
                    n = NULL;
                    break;
                }
                struct tnode *v = parse_expr(P);
                if (!v || nvec_push(P, &items, k) || nvec_push(P, &items, v))
                    n = NULL;
            }
            if (n) {
                advance(P);
                n->kids = items.v;
                n->n_kids = items.n;
            }
        } else {
            n = pfail(P, "unexpected operator%s", NULL);
        }
        break;
    default:
        n = pfail(P, "expected an expression%s", NULL);
    }
    P->depth--;
    return n;
}

/* Filters after '|' (or the first filter of a filter block when inline). */
static struct tnode *parse_filters(struct parser *P, struct tnode *node, int start_inline)
{
    while (is_op(P, "|") || start_inline) {
        if (!start_inline)
            advance(P);
        start_inline = 0;
        const struct ttoken *t = cur(P);
        if (t->type != TK_NAME)
            return pfail(P, "expected a filter name%s", NULL);
        struct tnode *f = node_new(P, E_FILTER, t);
        if (!f)
            return NULL;
        f->a = node;
        f->s = t->p;
        f->sn = t->n;
        f->op = tpl_filter_id(t->p, t->n);
        advance(P);
        if (is_op(P, "(") && parse_call_args(P, f))
            return NULL;
        node = f;
    }
    return node;
}

static struct tnode *parse_test(struct parser *P, struct tnode *node)
{
    const struct ttoken *at = cur(P);
    advance(P); /* is */
    struct tnode *t = node_new(P, E_TEST, at);
    if (!t)
        return NULL;
    t->a = node;
    if (is_name(P, "not")) {
        t->neg = 1;
        advance(P);
    }
    const struct ttoken *nt = cur(P);
    if (nt->type != TK_NAME)
        return pfail(P, "expected a test name%s", NULL);
    t->s = nt->p;
    t->sn = nt->n;
    t->op = tpl_test_id(nt->p, nt->n);
    advance(P);
    const struct ttoken *c = cur(P);
    if (is_op(P, "(")) {
        if (parse_call_args(P, t))
            return NULL;
    } else if ((c->type == TK_NAME || c->type == TK_STRING || c->type == TK_INT ||
                c->type == TK_FLOAT || is_op(P, "[") || is_op(P, "{")) &&
               !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
        if (is_name(P, "is"))
            return pfail(P, "you cannot chain multiple tests with is%s", NULL);
        struct tnode *arg = parse_postfix(P, parse_primary(P));
        if (!arg)
            return NULL;
        t->kids = ta_alloc(P->a, sizeof *t->kids);
        if (!t->kids)
            return NULL;
        t->kids[0] = arg;
        t->n_kids = 1;
    }
    return t;
}

static struct tnode *parse_filter_expr(struct parser *P, struct tnode *node)
{
    while (node) {
        if (is_op(P, "|")) {
            node = parse_filters(P, node, 0);
        } else if (is_name(P, "is")) {
            node = parse_test(P, node);
        } else if (is_op(P, "(")) {
            node = parse_postfix(P, node);
        } else {
            break;
        }
    }
    return node;
}

static struct tnode *parse_unary(struct parser *P, int with_filter)
{
    const struct ttoken *t = cur(P);
    struct tnode *node;
    if (++P->depth > PARSE_MAX_DEPTH) {
        kwk_err_set(P->err, KWK_ELIMIT, "template nests expressions too deeply (line %d)",
                    t->line);
        return NULL;
    }
    if (is_op(P, "-") || is_op(P, "+")) {
        int kind = is_op(P, "-") ? E_NEG : E_POS;
        advance(P);
        struct tnode *inner = parse_unary(P, 0);
        node = inner ? node_new(P, kind, t) : NULL;
        if (node)
            node->a = inner;
    } else {
        node = parse_primary(P);
    }
    node = parse_postfix(P, node);
    if (with_filter)
        node = parse_filter_expr(P, node);
    P->depth--;
    return node;
}

static struct tnode *binop(struct parser *P, const struct ttoken *at, int op, struct tnode *l,
                           struct tnode *r)
{
    if (!l || !r)
        return NULL;
    struct tnode *n = node_new(P, E_BINOP, at);
    if (n) {
        n->op = op;
        n->a = l;
        n->b = r;
    }
    return n;
}

static struct tnode *parse_pow(struct parser *P)
{
    struct tnode *l = parse_unary(P, 1);
    while (l && is_op(P, "**")) {
        const struct ttoken *at = cur(P);
        advance(P);
        l = binop(P, at, OP_POW, l, parse_unary(P, 1));
    }
    return l;
}

static struct tnode *parse_math2(struct parser *P)
{
    struct tnode *l = parse_pow(P);
    while (l) {
        const struct ttoken *at = cur(P);
        int op = is_op(P, "*") ? OP_MUL : is_op(P, "/") ? OP_DIV : is_op(P, "//") ? OP_FLOORDIV
                 : is_op(P, "%") ? OP_MOD : 0;
        if (!op)
            break;
        advance(P);
        l = binop(P, at, op, l, parse_pow(P));
    }
    return l;
}

static struct tnode *parse_concat(struct parser *P)
{
    struct tnode *l = parse_math2(P);
    while (l && is_op(P, "~")) {
        const struct ttoken *at = cur(P);
        advance(P);
        l = binop(P, at, OP_CONCAT, l, parse_math2(P));
    }
    return l;
}

static struct tnode *parse_math1(struct parser *P)
{
    struct tnode *l = parse_concat(P);
    while (l && (is_op(P, "+") || is_op(P, "-"))) {
        const struct ttoken *at = cur(P);
        int op = is_op(P, "+") ? OP_ADD : OP_SUB;
        advance(P);
        l = binop(P, at, op, l, parse_concat(P));
    }
    return l;
}

static struct tnode *parse_compare(struct parser *P)
{
    const struct ttoken *at = cur(P);
    struct tnode *first = parse_math1(P);
    struct nvec rest = {0};
    int ops[64];
    size_t n_ops = 0;
    while (first) {
        int op = is_op(P, "==") ? CMP_EQ : is_op(P, "!=") ? CMP_NE : is_op(P, "<") ? CMP_LT
                 : is_op(P, "<=") ? CMP_LE : is_op(P, ">") ? CMP_GT : is_op(P, ">=") ? CMP_GE
                 : is_name(P, "in") ? CMP_IN : 0;
        if (!op && is_name(P, "not") && tok_is(peek(P, 1), TK_NAME, "in")) {
            advance(P);
            op = CMP_NOTIN;
        }
        if (!op)
            break;
        if (n_ops == KWK_ARRAY_LEN(ops))
            return pfail(P, "too many chained comparisons%s", NULL);
        advance(P);
        struct tnode *r = parse_math1(P);
        if (!r || nvec_push(P, &rest, r))
            return NULL;
        ops[n_ops++] = op;
    }
    if (!first || !n_ops)
        return first;
    struct tnode *c = node_new(P, E_COMPARE, at);
    if (!c)
        return NULL;
    c->a = first;
    c->kids = rest.v;
    c->n_kids = rest.n;
    c->ops = ta_alloc(P->a, n_ops * sizeof(int));
    if (!c->ops)
        return NULL;
    memcpy(c->ops, ops, n_ops * sizeof(int));
    return c;
}

static struct tnode *parse_not(struct parser *P)
{
    if (is_name(P, "not")) {
        const struct ttoken *at = cur(P);
        advance(P);
        if (++P->depth > PARSE_MAX_DEPTH) {
            kwk_err_set(P->err, KWK_ELIMIT, "template nests expressions too deeply (line %d)",
                        at->line);
            return NULL;
        }
        struct tnode *inner = parse_not(P);
        P->depth--;
        struct tnode *n = inner ? node_new(P, E_NOT, at) : NULL;
        if (n)
            n->a = inner;
        return n;
    }
    return parse_compare(P);
}

static struct tnode *parse_and(struct parser *P)
{
    struct tnode *l = parse_not(P);
    while (l && is_name(P, "and")) {
        const struct ttoken *at = cur(P);
        advance(P);
        struct tnode *r = parse_not(P);
        struct tnode *n = r ? node_new(P, E_AND, at) : NULL;
        if (n) {
            n->a = l;
            n->b = r;
        }
        l = n;
    }
    return l;
}

static struct tnode *parse_or(struct parser *P)
{
    struct tnode *l = parse_and(P);
    while (l && is_name(P, "or")) {
        const struct ttoken *at = cur(P);
        advance(P);
        struct tnode *r = parse_and(P);
        struct tnode *n = r ? node_new(P, E_OR, at) : NULL;
        if (n) {
            n->a = l;
            n->b = r;
        }
        l = n;
    }
    return l;
}

static struct tnode *parse_condexpr(struct parser *P)
{
    struct tnode *e1 = parse_or(P);
    while (e1 && is_name(P, "if")) {
        const struct ttoken *at = cur(P);
        advance(P);
        struct tnode *cond = parse_or(P), *e3 = NULL;
        if (!cond)
            return NULL;
        if (is_name(P, "else")) {
            advance(P);
            if (++P->depth > PARSE_MAX_DEPTH) {
                kwk_err_set(P->err, KWK_ELIMIT, "template nests expressions too deeply");
                return NULL;
            }
            e3 = parse_condexpr(P);
            P->depth--;
            if (!e3)
                return NULL;
        }
        struct tnode *n = node_new(P, E_COND, at);
        if (!n)
            return NULL;
        n->a = cond;
        n->b = e1;
        n->c = e3;
        e1 = n;
    }
    return e1;
}

static struct tnode *parse_expr(struct parser *P)
{
    return parse_condexpr(P);
}

static int tuple_end(struct parser *P, const char *extra_end)
{
    const struct ttoken *t = cur(P);
    if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || t->type == TK_EOF || is_op(P, ")"))
        return 1;
    return extra_end && is_name(P, extra_end);
}

static struct tnode *parse_tuple(struct parser *P, int with_condexpr, const char *extra_end,
                                 int explicit_parens)
{
    const struct ttoken *at = cur(P);
    struct nvec items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n && expect_op(P, ","))
            return NULL;
        if (tuple_end(P, extra_end))
            break;
        struct tnode *e = with_condexpr ? parse_expr(P) : parse_or(P);
        if (!e || nvec_push(P, &items, e))
            return NULL;
        if (is_op(P, ","))
            is_tuple = 1;
        else
            break;
    }
    if (!is_tuple) {
        if (items.n)
            return items.v[0];
        if (!explicit_parens)
            return pfail(P, "expected an expression%s", NULL);
    }
    struct tnode *t = node_new(P, E_TUPLE, at);
    if (t) {
        t->kids = items.v;
        t->n_kids = items.n;
    }
    return t;
}

/* Assignment targets: name, (a, b), a, b or ns.attr. */
static struct tnode *parse_target(struct parser *P, int with_namespace, const char *extra_end)
{
    const struct ttoken *at = cur(P);
    if (with_namespace && cur(P)->type == TK_NAME && tok_is(peek(P, 1), TK_OP, ".") &&
        peek(P, 2)->type == TK_NAME) {
        struct tnode *g = node_new(P, E_GETATTR, at), *nm = node_new(P, E_NAME, at);
        if (!g || !nm)
            return NULL;
        nm->s = at->p;
        nm->sn = at->n;
        nm->sym = tsyms_intern(P->syms, P->a, at->p, at->n);
        g->a = nm;
        g->s = peek(P, 2)->p;
        g->sn = peek(P, 2)->n;
        advance(P);
        advance(P);
        advance(P);
        return nm->sym < 0 ? NULL : g;
    }
    struct namevec names = {0};
    int parens = 0, is_tuple = 0;
    if (is_op(P, "(")) {
        parens = 1;
        advance(P);
    }
    for (;;) {
        if (cur(P)->type != TK_NAME)
            return pfail(P, "expected a name to assign to%s", NULL);
        if (names_push(P, &names, cur(P)->p, cur(P)->n))
            return NULL;
        advance(P);
        if (!is_op(P, ","))
            break;
        is_tuple = 1;
        advance(P);
        if ((parens && is_op(P, ")")) || (!parens && (is_name(P, "in") || is_op(P, "=") ||
                                                       tuple_end(P, extra_end))))
            break;
    }
    if (parens && expect_op(P, ")"))
        return NULL;
    struct tnode *t = node_new(P, (is_tuple || parens) && names.n != 1 ? E_TUPLE : E_NAME, at);
    if (!t)
        return NULL;
    if (is_tuple && names.n == 1)
        t->kind = E_TUPLE;
    t->names = names.v;
    t->n_names = names.n;
    t->s = names.v[0].p;
    t->sn = names.v[0].n;
    t->sym = names.v[0].sym;
    return t;
}

static int end_tag(struct parser *P)
{
    advance(P); /* the end name */
    return expect_block_end(P);
}

static struct tnode *parse_if(struct parser *P, const struct ttoken *at)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const ends2[] = {"endif", NULL};
    struct tnode *n = node_new(P, N_IF, at);
    if (!n || !(n->a = parse_tuple(P, 0, NULL, 0)) || expect_block_end(P))
        return NULL;
    int which;
    if (!(n->b = parse_body(P, ends, &which)))
        return NULL;
    if (which == 0) {
        const struct ttoken *e = cur(P);
        advance(P);
        n->c = parse_if(P, e);
        return n->c ? n : NULL;
    }
    if (which == 1) {
        if (end_tag(P) || !(n->c = parse_body(P, ends2, &which)))
            return NULL;
    }
    return end_tag(P) ? NULL : n;
}

static struct tnode *parse_for(struct parser *P, const struct ttoken *at)
{
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const ends2[] = {"endfor", NULL};
    struct tnode *n = node_new(P, N_FOR, at);
    if (!n)
        return NULL;
    struct tnode *target = parse_target(P, 0, "in");
    if (!target)
        return NULL;
    n->names = target->names;
    n->n_names = target->n_names;
    n->neg = target->kind == E_TUPLE; /* unpack */
    if (!is_name(P, "in"))
        return pfail(P, "expected 'in' in for loop%s", NULL);
    advance(P);
    if (!(n->a = parse_tuple(P, 0, "recursive", 0)))
        return NULL;
    if (is_name(P, "if")) {
        advance(P);
        if (!(n->d = parse_expr(P)))
            return NULL;
    }
    if (is_name(P, "recursive"))
        return pfail(P, "recursive for loops are not supported%s", NULL);
    if (expect_block_end(P))
        return NULL;
    int which;
    P->in_loop++;
    n->b = parse_body(P, ends, &which);
    P->in_loop--;
    if (!n->b)
        return NULL;
    if (which == 1) {
        if (end_tag(P) || !(n->c = parse_body(P, ends2, &which)))
            return NULL;
    }
    return end_tag(P) ? NULL : n;
}

static struct tnode *parse_set(struct parser *P, const struct ttoken *at)
{
    static const char *const ends[] = {"endset", NULL};
    struct tnode *target = parse_target(P, 1, NULL);
    if (!target)
        return NULL;
    if (is_op(P, "=")) {
        advance(P);
        struct tnode *n = node_new(P, N_SET, at);
        if (!n || !(n->b = parse_tuple(P, 1, NULL, 0)) || expect_block_end(P))
            return NULL;
        n->a = target;
        return n;
    }
    struct tnode *n = node_new(P, N_SET_BLOCK, at);
    if (!n)
        return NULL;
    n->a = target;
    if (is_op(P, "|")) {
        if (!(n->d = parse_filters(P, NULL, 0)))
            return NULL;
    }
    int which;
    if (expect_block_end(P) || !(n->b = parse_body(P, ends, &which)))
        return NULL;
    return end_tag(P) ? NULL : n;
}

/* Parameters "(a, b=1, ...)" of a macro or call block. */
static int parse_params(struct parser *P, struct tnode *n)
{
    struct namevec names = {0};
    struct nvec defs = {0};
    if (expect_op(P, "("))
        return -1;
    while (!is_op(P, ")")) {
        if (names.n && expect_op(P, ","))
            return -1;
        if (cur(P)->type != TK_NAME) {
            pfail(P, "expected a parameter name%s", NULL);
            return -1;
        }
        if (names_push(P, &names, cur(P)->p, cur(P)->n))
            return -1;
        advance(P);
        struct tnode *d = NULL;
        if (is_op(P, "=")) {
            advance(P);
            if (!(d = parse_expr(P)))
                return -1;
        } else if (defs.n && defs.v[defs.n - 1]) {
            pfail(P, "non-default argument follows default argument%s", NULL);
            return -1;
        }
        if (nvec_push(P, &defs, d))
            return -1;
    }
    advance(P);
    n->names = names.v;
    n->n_names = names.n;
    n->kids = defs.v;
    n->n_kids = defs.n;
    return 0;
}

static struct tnode *parse_macro(struct parser *P, const struct ttoken *at)
{
    static const char *const ends[] = {"endmacro", NULL};
    struct tnode *n = node_new(P, N_MACRO, at);
    if (!n)
        return NULL;
    if (cur(P)->type != TK_NAME)
        return pfail(P, "expected a macro name%s", NULL);
    n->s = cur(P)->p;
    n->sn = cur(P)->n;
    n->sym = tsyms_intern(P->syms, P->a, n->s, n->sn);
    advance(P);
    int which, saved = P->in_loop;
    P->in_loop = 0;
    if (n->sym < 0 || parse_params(P, n) || expect_block_end(P) ||
        !(n->b = parse_body(P, ends, &which))) {
        P->in_loop = saved;
        return NULL;
    }
    P->in_loop = saved;
    return end_tag(P) ? NULL : n;
}

static struct tnode *parse_call_block(struct parser *P, const struct ttoken *at)
{
    static const char *const ends[] = {"endcall", NULL};
    struct tnode *n = node_new(P, N_CALL_BLOCK, at);
    if (!n)
        return NULL;
    if (is_op(P, "(") && parse_params(P, n))
        return NULL;
    if (!(n->a = parse_expr(P)))
        return NULL;
    if (n->a->kind != E_CALL)
        return pfail(P, "expected a call in call block%s", NULL);
    int which;
    if (expect_block_end(P) || !(n->b = parse_body(P, ends, &which)))
        return NULL;
    return end_tag(P) ? NULL : n;
}

static struct tnode *parse_statement(struct parser *P)
{
    const struct ttoken *at = cur(P);
    if (at->type != TK_NAME)
        return pfail(P, "expected a statement name%s", NULL);
    advance(P);
    if (tok_is(at, TK_NAME, "if"))
        return parse_if(P, at);
    if (tok_is(at, TK_NAME, "for"))
        return parse_for(P, at);
    if (tok_is(at, TK_NAME, "set"))
        return parse_set(P, at);
    if (tok_is(at, TK_NAME, "macro"))
        return parse_macro(P, at);
    if (tok_is(at, TK_NAME, "call"))
        return parse_call_block(P, at);
    if (tok_is(at, TK_NAME, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        struct tnode *n = node_new(P, N_FILTER_BLOCK, at);
        int which;
        if (!n || !(n->a = parse_filters(P, NULL, 1)) || expect_block_end(P) ||
            !(n->b = parse_body(P, ends, &which)))
            return NULL;
        return end_tag(P) ? NULL : n;
    }
    if (tok_is(at, TK_NAME, "generation")) {
        /* transformers' AssistantTracker: rendered as its content. */
        static const char *const ends[] = {"endgeneration", NULL};
        struct tnode *b;
        int which;
        if (expect_block_end(P) || !(b = parse_body(P, ends, &which)))
            return NULL;
        return end_tag(P) ? NULL : b;
    }
    if (tok_is(at, TK_NAME, "break") || tok_is(at, TK_NAME, "continue")) {
        if (!P->in_loop) {
            P->i--;
            return pfail(P, "%s outside of a loop", tok_is(at, TK_NAME, "break") ? "break" :
                         "continue");
        }
        struct tnode *n = node_new(P, tok_is(at, TK_NAME, "break") ? N_BREAK : N_CONTINUE, at);
        return !n || expect_block_end(P) ? NULL : n;
    }
    P->i--;
    char name[48];
    snprintf(name, sizeof name, "%.*s", (int)KWK_MIN(at->n, (size_t)40), at->p);
    return pfail(P, "encountered unknown tag '%s'", name);
}

static int in_list(const struct ttoken *t, const char *const *ends)
{
    for (int i = 0; ends && ends[i]; i++)
        if (tok_is(t, TK_NAME, ends[i]))
            return i;
    return -1;
}

static struct tnode *parse_body(struct parser *P, const char *const *ends, int *which)
{
    struct nvec kids = {0};
    struct tnode *body = node_new(P, N_BODY, cur(P));
    if (!body)
        return NULL;
    if (++P->depth > PARSE_MAX_DEPTH) {
        kwk_err_set(P->err, KWK_ELIMIT, "template nests blocks too deeply (line %d)",
                    cur(P)->line);
        return NULL;
    }
    for (;;) {
        const struct ttoken *t = cur(P);
        struct tnode *n = NULL;
        if (t->type == TK_EOF) {
            if (ends)
                return pfail(P, "unexpected end of template, expected '%s'", ends[0]);
            break;
        } else if (t->type == TK_DATA) {
            n = node_new(P, N_TEXT, t);
            if (n) {
                n->s = t->p;
                n->sn = t->n;
            }
            advance(P);
        } else if (t->type == TK_VAR_BEGIN) {
            advance(P);
            n = node_new(P, N_OUTPUT, t);
            if (n && !(n->a = parse_tuple(P, 1, NULL, 0)))
                return NULL;
            if (cur(P)->type != TK_VAR_END)
                return pfail(P, "expected end of print statement%s", NULL);
            advance(P);
        } else if (t->type == TK_BLOCK_BEGIN) {
            advance(P);
            int w = in_list(cur(P), ends);
            if (w >= 0) {
                *which = w;
                break;
            }
            n = parse_statement(P);
        } else {
            return pfail(P, "unexpected token%s", NULL);
        }
        if (!n || nvec_push(P, &kids, n))
            return NULL;
    }
    P->depth--;
    body->kids = kids.v;
    body->n_kids = kids.n;
    return body;
}

/* jinja2 rejects an unknown filter or test when it compiles the template, unless it sits in
 * an if statement or a conditional expression ("soft" frames), where it fails only if run. */
static int check_names(const struct tnode *n, int soft, int depth, struct kwk_err *err)
{
    if (!n)
        return 0;
    if (depth > 4 * PARSE_MAX_DEPTH)
        return 0;
    if ((n->kind == E_FILTER || n->kind == E_TEST) && n->op < 0 && !soft) {
        kwk_err_set(err, KWK_ESYNTAX, "template syntax error at line %d, column %d: No %s named "
                    "'%.*s'.", n->line, n->col, n->kind == E_FILTER ? "filter" : "test",
                    (int)KWK_MIN(n->sn, (size_t)60), n->s);
        if (err) {
            err->line = n->line;
            err->col = n->col;
        }
        return KWK_ESYNTAX;
    }
    int kid_soft = soft, body_soft = soft;
    switch (n->kind) {
    case N_IF:
    case E_COND: kid_soft = body_soft = 1; break;
    case N_FOR:
    case N_MACRO:
    case N_CALL_BLOCK:
    case N_SET_BLOCK:
    case N_FILTER_BLOCK: body_soft = 0; break;
    default: break;
    }
    int rc;
    if ((rc = check_names(n->a, kid_soft, depth + 1, err)) ||
        (rc = check_names(n->b, body_soft, depth + 1, err)) ||
        (rc = check_names(n->c, kid_soft, depth + 1, err)) ||
        (rc = check_names(n->d, kid_soft, depth + 1, err)))
        return rc;
    for (size_t i = 0; i < n->n_kids; i++)
        if ((rc = check_names(n->kids[i], kid_soft, depth + 1, err)))
            return rc;
    for (size_t i = 0; n->kids2 && i < n->n_names; i++)
        if ((rc = check_names(n->kids2[i], kid_soft, depth + 1, err)))
            return rc;
    return 0;
}

int tpl_parse(const struct ttoken *toks, size_t n_toks, struct tarena *a, struct tsyms *syms,
              struct tnode **root, struct kwk_err *err)
{
    struct parser P = {.t = toks, .n = n_toks, .a = a, .syms = syms, .err = err};
    if (err)
        err->code = 0;
    *root = parse_body(&P, NULL, NULL);
    if (!*root)
        return err && err->code ? err->code : KWK_ESYNTAX;
    return check_names(*root, 0, 0, err);
}
