/* template.h - internal contract of the chat-template (Jinja) engine: arena, values, tokens, the
 * syntax tree and the evaluator entry points. A parsed template is immutable and may be rendered
 * from several threads at once; each render owns its own arena and state. */
#ifndef KWK_TEMPLATE_H
#define KWK_TEMPLATE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* ---- arena: every tree node (per template) and every value (per render) lives in one ---- */

struct ta_chunk;

struct tarena {
    struct ta_chunk *head;
    size_t total; /* bytes reserved from the system so far */
    size_t limit; /* 0 = unlimited; beyond it allocations fail (KWK_ELIMIT) */
};

void ta_init(struct tarena *a, size_t limit);
void ta_free(struct tarena *a);
/* Zeroed memory, 16-byte aligned; NULL when the limit or the system refuses. */
void *ta_alloc(struct tarena *a, size_t n);
/* Copy n bytes into the arena (NUL-terminated); NULL on failure. */
char *ta_memdup(struct tarena *a, const char *p, size_t n);

/* ---- growable byte buffer with a size limit and a sticky error ---- */

struct tbuf {
    char *p;
    size_t n, cap;
    size_t limit; /* 0 = unlimited */
    int err;      /* 0 or KWK_ELIMIT / -ENOMEM; once set, appends are ignored */
};

void tb_init(struct tbuf *b, size_t limit);
void tb_free(struct tbuf *b);
void tb_put(struct tbuf *b, const char *p, size_t n);
void tb_putc(struct tbuf *b, char c);
void tb_puts(struct tbuf *b, const char *s);
void tb_printf(struct tbuf *b, const char *fmt, ...) KWK_PRINTF(2, 3);
/* Append code point cp as UTF-8. */
void tb_put_cp(struct tbuf *b, uint32_t cp);

/* ---- UTF-8 helpers (invalid bytes count as one code point each) ---- */

/* Decode one code point at p[0..n); stores its byte length in *len (>= 1). */
uint32_t tu_decode(const char *p, size_t n, size_t *len);
size_t tu_count(const char *p, size_t n);
/* Byte offset of code point index i (clamped to n). */
size_t tu_offset(const char *p, size_t n, size_t i);

/* ---- values ---- */

enum tv_kind {
    TV_UNDEF = 0,
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST, /* flag TVF_TUPLE: an immutable tuple (prints with parentheses) */
    TV_DICT,
    TV_NS,      /* namespace(): a dict whose entries are attributes */
    TV_MACRO,   /* a macro or a call block's caller() */
    TV_BUILTIN, /* a global function: range, namespace, dict, raise_exception, ... */
    TV_METHOD,  /* a method bound to a value: "abc".upper, d.items, loop.cycle */
    TV_LOOP,    /* the loop variable of a for loop */
};

#define TVF_TUPLE 1u
#define TVF_SAFE 2u /* a string marked safe (jinja2 Markup): str operands of + get escaped */
#define TVF_GEN 4u  /* a list standing for a jinja2 generator (select, map, ...): always true */
#define TVF_RANGE 8u /* a list made by range(): prints as range(start, stop[, step]) */

struct tlist;
struct tdict;
struct tmacro;
struct tbound;
struct tloop;

struct tv {
    uint8_t k;     /* enum tv_kind */
    uint8_t flag;  /* TVF_* */
    uint32_t id;   /* TV_BUILTIN: enum tbuiltin */
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *p; /* UTF-8, not NUL-terminated; for TV_UNDEF the error message that
                              using it raises (NUL-terminated) or NULL */
            size_t n;
        } s;
        struct tlist *l;
        struct tdict *d;
        struct tmacro *m;
        struct tbound *bm;
        struct tloop *lp;
    } u;
};

struct tlist {
    struct tv *v;
    size_t n, cap;
    int64_t range[3]; /* start, stop, step of a TVF_RANGE list */
};

struct tdict {
    struct tv *keys;
    struct tv *vals;
    size_t n, cap;
};

struct tbound {
    struct tv self;
    int method; /* enum tmethod */
};

enum tbuiltin {
    TB_RANGE = 1,
    TB_NAMESPACE,
    TB_DICT,
    TB_RAISE,
    TB_STRFTIME,
    TB_CYCLER,
    TB_JOINER,
    TB_LIPSUM,
};

/* ---- tokens and tree ---- */

enum ttok {
    TK_EOF = 0,
    TK_DATA,      /* raw template text (already trimmed per whitespace control) */
    TK_VAR_BEGIN, /* {{ */
    TK_VAR_END,
    TK_BLOCK_BEGIN, /* {% */
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING, /* value already unescaped */
    TK_INT,
    TK_FLOAT,
    TK_OP, /* text holds the operator */
};

struct ttoken {
    int type;
    int line, col;
    const char *p; /* text (arena or source) */
    size_t n;
    int64_t ival;
    double fval;
};

struct tlex_opts {
    int trim_blocks;
    int lstrip_blocks;
};

/* Tokenize src into an arena array. Returns 0 or KWK_ESYNTAX/KWK_ELIMIT with err filled. */
int tpl_lex(const char *src, size_t len, const struct tlex_opts *o, struct tarena *a,
            struct ttoken **toks, size_t *n_toks, struct kwk_err *err);

enum tnode_kind {
    /* statements */
    N_BODY = 1, /* kids[0..n) in order */
    N_TEXT,     /* s */
    N_OUTPUT,   /* a */
    N_IF,       /* a = cond, b = then body, c = else (body or N_IF for elif) */
    N_FOR,      /* targets in names, a = iterable, b = body, c = else body, d = filter */
    N_SET,      /* a = target expr (E_NAME / E_TUPLE of names / E_GETATTR on a namespace), b */
    N_SET_BLOCK, /* a = target, b = body, d = filter chain (E_FILTER with a NULL source) */
    N_MACRO,    /* s = name, sym, params in names, kids = defaults (NULL when none), b = body */
    N_CALL_BLOCK, /* a = call expression, params in names, b = body (caller) */
    N_FILTER_BLOCK, /* a = filter chain, b = body */
    N_BREAK,
    N_CONTINUE,
    N_DO, /* a */
    /* expressions */
    E_CONST, /* val */
    E_NAME,  /* s, sym */
    E_LIST,  /* kids */
    E_TUPLE, /* kids */
    E_DICT,  /* kids: key, value, key, value ... */
    E_GETATTR, /* a, s (attribute name) */
    E_GETITEM, /* a, b (index) */
    E_SLICE,   /* a = start, b = stop, c = step (any may be NULL) - only inside E_GETITEM */
    E_CALL,    /* a = callee, kids = positional args, kw names in names, kw values in kids2 */
    E_FILTER,  /* a = source (NULL in filter blocks), s = name, op = filter id, args as E_CALL */
    E_TEST,    /* a = operand, s = name, op = test id, neg, args as E_CALL */
    E_NOT,     /* a */
    E_NEG,     /* a */
    E_POS,     /* a */
    E_BINOP,   /* op = enum tbinop, a, b */
    E_COMPARE, /* a = first operand, kids = further operands, ops in ops[] */
    E_AND,
    E_OR,
    E_COND, /* a = test, b = true value, c = false value (may be NULL) */
};

enum tbinop {
    OP_ADD = 1,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_CONCAT,
};

enum tcmp { CMP_EQ = 1, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

struct tname {
    const char *p;
    size_t n;
    int sym;
};

struct tnode {
    int kind;
    int op;  /* binop / filter id / test id */
    int neg; /* E_TEST: "is not" */
    int line, col;
    const char *s; /* name / text */
    size_t sn;
    int sym;
    struct tv val;
    struct tnode *a, *b, *c, *d;
    struct tnode **kids;
    size_t n_kids;
    struct tnode **kids2; /* keyword-argument values */
    struct tname *names;  /* for targets, macro parameters, keyword-argument names */
    size_t n_names;
    int *ops; /* E_COMPARE */
};

struct tsyms {
    struct tname *v;
    size_t n, cap;
};

/* Parse tokens into a tree allocated in a. */
int tpl_parse(const struct ttoken *toks, size_t n_toks, struct tarena *a, struct tsyms *syms,
              struct tnode **root, struct kwk_err *err);
int tsyms_intern(struct tsyms *s, struct tarena *a, const char *p, size_t n);
/* Symbol id of name, or -1. */
int tsyms_find(const struct tsyms *s, const char *p, size_t n);

/* ---- evaluation ---- */

enum tdialect {
    TD_JINJA2 = 0, /* what Python's jinja2 (transformers) renders */
    TD_HFJS = 1,   /* huggingface.js @huggingface/jinja printing (lowercase booleans, JSON-ish
                      lists, string + number concatenation) */
};

struct tscope;

struct trender {
    struct tarena *a;
    const struct tsyms *syms;
    struct tscope *globals; /* the context */
    struct kwk_err *err;
    int dialect;
    uint64_t steps, max_steps;
    int depth, max_depth;
    size_t max_output;
    int64_t now; /* unix seconds for strftime_now */
    int have_now;
    int ctl; /* pending break (1) / continue (2) */
    struct tbuf *out; /* where text goes (swapped for captures) */
    int sym_loop;     /* symbol of "loop" (-1 none), -2 until looked up */
    int nest;         /* evaluator recursion, bounded to protect the C stack */
};

/* Recursion of the evaluator (expressions within statements within macro calls); Python's own
 * recursion limit stops jinja2 near 1000 frames. */
#define TPL_MAX_NEST 1500

/* Evaluate expression n into *v. Returns 0 or a negative code with r->err set. */
int tpl_eval(struct trender *r, struct tscope *sc, const struct tnode *n, struct tv *v);
/* Render statement list n into r->out. */
int tpl_exec(struct trender *r, struct tscope *sc, const struct tnode *n);
int tpl_render_root(struct trender *r, const struct tnode *root, const struct tv *context);

/* Errors: set r->err and return the code. */
int tpl_fail(struct trender *r, int code, const struct tnode *at, const char *fmt, ...)
    KWK_PRINTF(4, 5);
/* Count one step, plus the hidden work done since the last one; KWK_ELIMIT past the limit. */
int tpl_step(struct trender *r, const struct tnode *at);

/* Work done inside single operations (element comparisons, dictionary probes, bytes scanned / 64)
 * accumulates here and is charged to the render's step budget at its next step, so that no
 * operation repeated within the budget can take unbounded time. One render runs on one thread;
 * the counter is per thread and reset when a render starts. */
#if defined(__GNUC__)
#define TPL_TLS_FAST __attribute__((tls_model("initial-exec")))
#else
#define TPL_TLS_FAST
#endif
extern _Thread_local uint64_t tpl_work TPL_TLS_FAST;

/* ---- values (template_value.c) ---- */

static inline struct tv tv_make(int k)
{
    struct tv v;
    v.k = (uint8_t)k;
    v.flag = 0;
    v.id = 0;
    v.u.s.p = NULL;
    v.u.s.n = 0;
    return v;
}

/* An undefined value; hint is the NUL-terminated message using it raises (or NULL). */
static inline struct tv tv_undef(const char *hint, size_t n)
{
    struct tv v = tv_make(TV_UNDEF);
    v.u.s.p = hint;
    v.u.s.n = n;
    return v;
}

/* Undefined values whose message is only formatted when they are used (tv.id says which). */
enum { TU_MSG = 0, TU_NAME = 1, TU_ATTR = 2 /* + index of the object's description */ };

static inline struct tv tv_undef_lazy(uint32_t kind, const char *name, size_t n)
{
    struct tv v = tv_undef(name, n);
    v.id = kind;
    return v;
}

static inline struct tv tv_none(void)
{
    return tv_make(TV_NONE);
}

static inline struct tv tv_bool(int b)
{
    struct tv v = tv_make(TV_BOOL);
    v.u.b = b != 0;
    return v;
}

static inline struct tv tv_int(int64_t i)
{
    struct tv v = tv_make(TV_INT);
    v.u.i = i;
    return v;
}

static inline struct tv tv_float(double f)
{
    struct tv v = tv_make(TV_FLOAT);
    v.u.f = f;
    return v;
}

static inline struct tv tv_str(const char *p, size_t n)
{
    struct tv v = tv_make(TV_STR);
    v.u.s.p = p ? p : "";
    v.u.s.n = n;
    return v;
}

/* Description of an object in jinja2's undefined messages ("dict object"), by TU_ATTR offset. */
const char *tpl_undef_desc(uint32_t idx);
uint32_t tpl_undef_desc_of(const struct tv *obj);
/* New empty list / dict in the render arena (NULL tv.u on failure: check with tv_ok). */
int tv_new_list(struct trender *r, size_t cap, struct tv *out);
int tv_new_dict(struct trender *r, size_t cap, struct tv *out);
int tl_push(struct trender *r, struct tlist *l, struct tv v);
int td_set(struct trender *r, struct tdict *d, struct tv key, struct tv val);
/* Pointer to the value under key, or NULL. */
struct tv *td_get(const struct tdict *d, struct tv key);
struct tv *td_get_str(const struct tdict *d, const char *p, size_t n);
int tv_str_copy(struct trender *r, const char *p, size_t n, struct tv *out);
int tv_from_buf(struct trender *r, struct tbuf *b, struct tv *out);

int tv_truthy(const struct tv *v);
/* Python ==. */
int tv_eq(const struct tv *a, const struct tv *b);
/* Python ordering: sets *res to <0, 0, >0; KWK_ERUNTIME when the types do not order. */
int tv_cmp(struct trender *r, const struct tnode *at, const struct tv *a, const struct tv *b,
           int *res);
const char *tv_type_name(const struct tv *v);
int tv_is_num(const struct tv *v); /* bool, int, float */
double tv_num(const struct tv *v);
/* Append str(v) as Python prints it (dialect aware). */
int tv_write_str(struct trender *r, struct tbuf *b, const struct tv *v);
/* Append repr(v). */
int tv_write_repr(struct trender *r, struct tbuf *b, const struct tv *v);
/* str(v) as a string value (no copy for strings). */
int tv_to_str(struct trender *r, const struct tv *v, struct tv *out);
/* Python float repr into buf (at least 32 bytes). */
void tv_float_repr(double f, char *buf, size_t cap);
/* Length (code points for strings); KWK_ERUNTIME when v has none. */
int tv_len(struct trender *r, const struct tnode *at, const struct tv *v, int64_t *n);
/* Iterate v into a list (strings: code points; dicts: keys; undefined: empty). */
int tv_iter(struct trender *r, const struct tnode *at, const struct tv *v, struct tlist **out);
/* Parse JSON text (what Python's json.dumps writes, NaN and Infinity included) into values. */
int tpl_json_parse(struct trender *r, const char *p, size_t n, struct tv *out);

/* ---- JSON out (template_json.c): Python json.dumps(ensure_ascii, indent, separators,
 * sort_keys) ---- */

struct tjson_opts {
    int ensure_ascii;
    const char *indent; /* NULL = no indent (one line) */
    size_t indent_n;
    const char *item_sep, *key_sep;
    int sort_keys;
};

int tpl_tojson(struct trender *r, const struct tnode *at, struct tbuf *b, const struct tv *v,
               const struct tjson_opts *o);

/* ---- filters, tests, methods (template_filters.c, template_methods.c) ---- */

int tpl_filter_id(const char *p, size_t n);
int tpl_test_id(const char *p, size_t n);
/* Run test by id over v with already-evaluated arguments. */
int tpl_run_test(struct trender *r, const struct tnode *at, int id, const struct tv *v,
                 const struct tv *args, size_t n_args, int *res);

/* Evaluated call arguments. */
struct targs {
    struct tv *pos;
    size_t n_pos;
    const struct tname *kw_names;
    struct tv *kw;
    size_t n_kw;
    struct tmacro *caller; /* the body of a {% call %} block, passed to the macro it calls */
};

struct tmacro {
    const struct tnode *def; /* N_MACRO or N_CALL_BLOCK */
    struct tscope *closure;  /* scope the macro was defined in */
};

struct tloop {
    struct tlist *items;
    size_t i;
};

int tpl_loop_attr(struct trender *r, const struct tnode *at, const struct tv *loop,
                  const char *name, size_t n, struct tv *out);
int tpl_loop_cycle(struct trender *r, const struct tnode *at, const struct tv *loop,
                   const struct targs *args, struct tv *out);

/* Evaluate the arguments of a call, filter or test node. */
int tpl_eval_args(struct trender *r, struct tscope *sc, const struct tnode *n, struct targs *a);
/* Run filter id over *in with evaluated arguments. */
int tpl_filter_run(struct trender *r, const struct tnode *at, int id, const struct tv *in,
                   const struct targs *args, struct tv *out);
/* Builtin id of a global name (range, namespace, ...), or 0. */
int tpl_builtin_id(const char *p, size_t n);
/* Make an undefined value whose use raises msg (formatted into the arena). */
struct tv tpl_undef(struct trender *r, const char *fmt, ...) KWK_PRINTF(2, 3);
/* Raise the error an undefined value carries. */
int tpl_undef_fail(struct trender *r, const struct tnode *at, const struct tv *u);

/* Keyword or positional argument i named name (NULL when absent). */
const struct tv *targ(const struct targs *a, size_t i, const char *name);

/* Attribute lookup as jinja2's sandbox does it (attribute, then item). */
int tpl_getattr(struct trender *r, const struct tnode *at, const struct tv *obj, const char *name,
                size_t n, struct tv *out);
int tpl_getitem(struct trender *r, const struct tnode *at, const struct tv *obj,
                const struct tv *key, struct tv *out);
/* Call a builtin or bound method. */
int tpl_call_method(struct trender *r, const struct tnode *at, const struct tbound *bm,
                    const struct targs *args, struct tv *out);
int tpl_call_builtin(struct trender *r, const struct tnode *at, int id, const struct targs *args,
                     struct tv *out);
/* Method id of a value's attribute, or -1. */
int tpl_method_id(const struct tv *obj, const char *name, size_t n);
/* HTML-escape s as markupsafe does (& < > " '). */
int tpl_html_escape(struct trender *r, const struct tv *s, struct tv *out);
/* Python "fmt % args". */
int tpl_percent_format(struct trender *r, const struct tnode *at, const struct tv *fmt,
                       const struct tv *args, struct tv *out);
/* Call a macro or caller with evaluated arguments. */
int tpl_call_macro(struct trender *r, const struct tnode *at, struct tmacro *m,
                   const struct targs *args, struct tv *out);
/* Slice of a string or list (Python semantics). */
int tpl_slice(struct trender *r, const struct tnode *at, const struct tv *obj, const struct tv *start,
              const struct tv *stop, const struct tv *step, struct tv *out);

#endif
