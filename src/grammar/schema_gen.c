/* schema_gen.c - GBNF for one flattened alternative: a part per JSON type it allows (enum
 * values, numbers and integer ranges, strings, arrays, objects). One conversion's thread. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/schema.h"

#define QUOTE "\"\\\"\"" /* the GBNF literal of one double quote */

void gen_repetition(struct sbuf *b, const char *item, int64_t min, int64_t max, const char *sep)
{
    if (max == 0)
        return;
    if (min == 0 && max == 1) {
        sb_printf(b, "%s?", item);
        return;
    }
    if (!sep) {
        if (max < 0)
            sb_printf(b, min == 0 ? "%s*" : min == 1 ? "%s+" : "%s{%lld,}", item,
                      (long long)min);
        else if (min == max)
            sb_printf(b, "%s{%lld}", item, (long long)min);
        else
            sb_printf(b, "%s{%lld,%lld}", item, (long long)min, (long long)max);
        return;
    }
    /* item (sep item){min-1,max-1}, all optional when min is 0 */
    struct sbuf group = {0};
    int rc = 0;
    sb_printf(&group, "(%s %s)", sep, item);
    char *g = sb_take(&group, &rc);
    if (!g) {
        b->err = b->err ? b->err : rc;
        return;
    }
    sb_puts(b, min == 0 ? "(" : "");
    sb_puts(b, item);
    if (max != 1) {
        sb_puts(b, " ");
        gen_repetition(b, g, min == 0 ? 0 : min - 1, max < 0 ? -1 : max - 1, NULL);
    }
    sb_puts(b, min == 0 ? ")?" : "");
    kwk_free(g);
}

static int too_many(struct sconv *c, const char *kw, const char *ptr, int64_t n)
{
    return sconv_fail(c, KWK_ELIMIT,
                      "json schema: \"%s\" at #%s: %lld is over the grammar's repetition limit "
                      "of %d",
                      kw, ptr, (long long)n, KWK_GRAMMAR_REPEAT_MAX);
}

static int take(struct sconv *c, struct sbuf *b, char **out)
{
    int rc = 0;
    *out = sb_take(b, &rc);
    if (!*out)
        return sconv_fail(c, rc, rc == KWK_ELIMIT ? "the grammar would exceed the size limit"
                                                  : "out of memory");
    return 0;
}

static int dup_name(struct sconv *c, const char *name, char **out)
{
    *out = name ? kwk_strdup(name) : NULL;
    if (name && !*out)
        return sconv_fail(c, -ENOMEM, "out of memory");
    return c->rc;
}

/* ---- values written out (enum, const) ---- */

/* The shortest %g that reads back as d (jansson writes 17 digits; a model, the short ones). */
static void real_text(double d, char *out, size_t cap)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, d);
        if (strtod(out, NULL) == d)
            break;
    }
    if (!strpbrk(out, ".eEn"))
        strncat(out, ".0", cap - strlen(out) - 1);
}

/* The JSON text of a value that GBNF writes as one literal (null, booleans, numbers, strings)
 * appended to b unescaped: 1; 0 for arrays and objects (nothing appended). */
static int scalar_text(struct sbuf *b, const json_t *v)
{
    char num[64];
    switch (json_typeof(v)) {
    case JSON_NULL: sb_puts(b, "null"); return 1;
    case JSON_TRUE: sb_puts(b, "true"); return 1;
    case JSON_FALSE: sb_puts(b, "false"); return 1;
    case JSON_INTEGER:
    case JSON_REAL:
        if (json_is_integral(v) && fabsl(json_is_integer(v) ? (long double)json_integer_value(v)
                                                            : json_real_value(v)) < 9.2e18L) {
            /* 1 and 1.0 are the same value to JSON Schema: written as an integer */
            long long n = json_is_integer(v) ? (long long)json_integer_value(v)
                                             : (long long)json_real_value(v);
            snprintf(num, sizeof num, "%lld", n);
        } else {
            real_text(json_real_value(v), num, sizeof num);
        }
        sb_puts(b, num);
        return 1;
    case JSON_STRING: {
        char *t = json_dumps(v, JSON_ENCODE_ANY);
        if (!t)
            b->err = b->err ? b->err : -ENOMEM;
        else
            sb_puts(b, t);
        free(t);
        return 1;
    }
    default: return 0;
    }
}

static void gen_value(struct sbuf *b, const json_t *v, int depth)
{
    size_t i;
    const char *k;
    json_t *x;
    struct sbuf lit = {0};
    if (depth > SCHEMA_DEPTH_MAX * 4) {
        b->err = KWK_ELIMIT;
        return;
    }
    switch (json_typeof(v)) {
    case JSON_ARRAY:
        sb_puts(b, "\"[\" space");
        json_array_foreach(v, i, x)
        {
            sb_puts(b, i ? " \",\" space " : " ");
            gen_value(b, x, depth + 1);
            sb_puts(b, " space");
        }
        sb_puts(b, " \"]\"");
        break;
    case JSON_OBJECT: {
        int first = 1;
        sb_puts(b, "\"{\" space");
        json_object_foreach((json_t *)v, k, x)
        {
            json_t *key = json_string(k);
            char *t = key ? json_dumps(key, JSON_ENCODE_ANY) : NULL;
            json_decref(key);
            if (!t) {
                b->err = -ENOMEM;
                return;
            }
            sb_puts(b, first ? " " : " \",\" space ");
            sb_literal(b, t, strlen(t));
            free(t);
            sb_puts(b, " space \":\" space ");
            gen_value(b, x, depth + 1);
            sb_puts(b, " space");
            first = 0;
        }
        sb_puts(b, " \"}\"");
        break;
    }
    default:
        scalar_text(&lit, v);
        if (lit.err)
            b->err = b->err ? b->err : lit.err;
        else
            sb_literal(b, lit.p, lit.n);
        sb_free(&lit);
    }
}

static size_t utf8_chars(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

unsigned schema_value_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_NULL: return T_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return T_BOOL;
    case JSON_OBJECT: return T_OBJECT;
    case JSON_ARRAY: return T_ARRAY;
    case JSON_STRING: return T_STRING;
    default: return json_is_integral(v) ? T_INTEGER : T_NUMBER;
    }
}

static int refuse_with_enum(struct sconv *c, const struct sflat *f, const char *what)
{
    return sconv_fail(c, KWK_EUNSUPPORTED,
                      "json schema: \"enum\" / \"const\" at #%s together with %s is not "
                      "supported",
                      f->ptr, what);
}

/* Whether enum value v passes f's other keywords: 1 yes, 0 no, negative: refused. */
static int enum_allows(struct sconv *c, const struct sflat *f, const json_t *v)
{
    int t = (int)schema_value_type(v);
    if (!(f->types & (unsigned)t))
        return 0;
    if (t == T_INTEGER || t == T_NUMBER) {
        long double d = json_is_integer(v) ? (long double)json_integer_value(v)
                                           : (long double)json_real_value(v);
        if (f->has_lo && (d < f->lo || (f->lo_excl && d == f->lo)))
            return 0;
        if (f->has_hi && (d > f->hi || (f->hi_excl && d == f->hi)))
            return 0;
    } else if (t == T_STRING) {
        if (f->pattern || f->format)
            return refuse_with_enum(c, f, f->pattern ? "\"pattern\"" : "\"format\"");
        size_t n = utf8_chars(json_string_value(v), json_string_length(v));
        if ((int64_t)n < f->min_len || (f->max_len >= 0 && (int64_t)n > f->max_len))
            return 0;
    } else if (t == T_ARRAY) {
        if (f->prefix || f->items)
            return refuse_with_enum(c, f, "\"items\" / \"prefixItems\"");
        int64_t n = (int64_t)json_array_size(v);
        if (n < f->min_items || (f->max_items >= 0 && n > f->max_items))
            return 0;
    } else if (t == T_OBJECT) {
        if (f->props || f->required || f->addl)
            return refuse_with_enum(c, f, "object keywords");
    }
    return 1;
}

/* One literal for the values written as one (gathered into a prefix tree: a flat list of n
 * would be n live stacks at the enum's start), alternatives beside it for arrays and objects. */
static int gen_enum(struct sconv *c, const struct sflat *f, const char *name, char **body)
{
    struct sbuf b = {0}, rest = {0};
    struct slits lits = {0};
    size_t i;
    json_t *v;
    int n_rest = 0, n_lits = 0, rc = 0;
    *body = NULL;
    json_array_foreach(f->enum_vals, i, v)
    {
        int ok = sconv_step(c) ? c->rc : enum_allows(c, f, v);
        size_t start = lits.text.n;
        if (ok < 0) {
            rc = ok;
            goto out;
        }
        if (!ok)
            continue;
        if (!scalar_text(&lits.text, v)) {
            sb_puts(&rest, n_rest++ ? " | " : "");
            gen_value(&rest, v, 0);
        } else if (slits_mark(&lits, start)) {
            rc = sconv_fail(c, -ENOMEM, "out of memory");
            goto out;
        }
    }
    if (!lits.n && !n_rest)
        goto out;
    sb_puts(&b, "(");
    if ((rc = schema_enum_trie(c, &lits, name, 1, &b, &n_lits)))
        goto out;
    sb_puts(&b, n_lits && n_rest ? " | " : "");
    if (rest.err)
        b.err = b.err ? b.err : rest.err;
    else if (n_rest)
        sb_put(&b, rest.p, rest.n);
    sb_puts(&b, ") space");
    if (!rule_primitive(c, "space")) {
        rc = c->rc;
        goto out;
    }
    rc = take(c, &b, body);
out:
    sb_free(&b);
    sb_free(&rest);
    slits_free(&lits);
    return rc;
}

/* ---- numbers ---- */

/* The integers of [lo, hi] as int64 bounds; 0 when there are none. */
static int int_bounds(struct sconv *c, const struct sflat *f, int *has_lo, int64_t *lo,
                      int *has_hi, int64_t *hi)
{
    const long double top = (long double)INT64_MAX, bottom = -(long double)INT64_MAX;
    *has_lo = *has_hi = 0;
    if (f->has_lo) {
        long double v = f->lo_excl ? floorl(f->lo) + 1 : ceill(f->lo);
        if (v > top)
            return sconv_fail(c, KWK_ELIMIT, "json schema: the bound at #%s is past 64 bits",
                              f->bound_ptr);
        /* below -(2^63 - 1): as unbounded, whose integers have at most 16 digits */
        if (v >= bottom) {
            *has_lo = 1;
            *lo = (int64_t)v;
        }
    }
    if (f->has_hi) {
        long double v = f->hi_excl ? ceill(f->hi) - 1 : floorl(f->hi);
        if (v < bottom)
            return sconv_fail(c, KWK_ELIMIT, "json schema: the bound at #%s is past 64 bits",
                              f->bound_ptr);
        if (v <= top) {
            *has_hi = 1;
            *hi = (int64_t)v;
        }
    }
    return 1;
}

static int gen_number(struct sconv *c, const struct sflat *f, char **body)
{
    int has_lo, has_hi;
    int64_t lo = 0, hi = 0;
    struct sbuf b = {0};
    *body = NULL;
    if (f->types & T_NUMBER) {
        if (f->has_lo || f->has_hi)
            return sconv_fail(c, KWK_EUNSUPPORTED,
                              "json schema: the bound at #%s cannot be enforced by a grammar on "
                              "numbers that are not integers (\"type\": \"integer\" can be)",
                              f->bound_ptr);
        return dup_name(c, rule_primitive(c, "number"), body);
    }
    if (!f->has_lo && !f->has_hi)
        return dup_name(c, rule_primitive(c, "integer"), body);
    int ok = int_bounds(c, f, &has_lo, &lo, &has_hi, &hi);
    if (ok <= 0)
        return c->rc;
    if (has_lo && has_hi && lo > hi)
        return 0;
    if (!has_lo && !has_hi)
        return dup_name(c, rule_primitive(c, "integer"), body);
    if (!rule_primitive(c, "space"))
        return c->rc;
    sb_puts(&b, "(");
    gen_int_range(&b, has_lo, lo, has_hi, hi);
    sb_puts(&b, ") space");
    return take(c, &b, body);
}

/* ---- strings ---- */

static const char *format_rule(const char *format)
{
    static const char *const map[][2] = {{"date", "date-string"},
                                         {"time", "time-string"},
                                         {"date-time", "date-time-string"},
                                         {"uuid", "uuid"}};
    for (size_t i = 0; i < KWK_ARRAY_LEN(map); i++)
        if (strcmp(format, map[i][0]) == 0)
            return map[i][1];
    return NULL;
}

static int gen_string(struct sconv *c, const struct sflat *f, const char *name, char **body)
{
    int has_len = f->min_len > 0 || f->max_len >= 0;
    struct sbuf b = {0};
    *body = NULL;
    if (f->format) {
        const char *r = format_rule(f->format);
        if (!r)
            return sconv_fail(c, KWK_EUNSUPPORTED,
                              "json schema: \"format\": \"%.60s\" at #%s cannot be enforced by "
                              "a grammar (date, time, date-time and uuid can)",
                              f->format, f->ptr);
        if (f->pattern || has_len)
            return sconv_fail(c, KWK_EUNSUPPORTED,
                              "json schema: \"format\" at #%s together with %s is not supported",
                              f->ptr, f->pattern ? "\"pattern\"" : "a length");
        return dup_name(c, rule_primitive(c, r), body);
    }
    if (f->pattern) {
        if (has_len)
            return sconv_fail(c, KWK_EUNSUPPORTED,
                              "json schema: \"pattern\" at #%s together with \"minLength\" / "
                              "\"maxLength\" is not supported",
                              f->pattern_ptr);
        return schema_gen_pattern(c, f->pattern, f->pattern_ptr, name, body);
    }
    if (!has_len)
        return dup_name(c, rule_primitive(c, "string"), body);
    if (f->max_len >= 0 && f->min_len > f->max_len)
        return 0;
    if (f->min_len > KWK_GRAMMAR_REPEAT_MAX || f->max_len > KWK_GRAMMAR_REPEAT_MAX)
        return too_many(c, f->max_len > KWK_GRAMMAR_REPEAT_MAX ? "maxLength" : "minLength",
                        f->ptr, KWK_MAX(f->min_len, f->max_len));
    const char *ch = rule_primitive(c, "char");
    if (!ch || !rule_primitive(c, "space"))
        return c->rc;
    sb_puts(&b, QUOTE " ");
    gen_repetition(&b, ch, f->min_len, f->max_len, NULL);
    sb_puts(&b, " " QUOTE " space");
    return take(c, &b, body);
}

/* ---- arrays ---- */

#define PREFIX_MAX 256 /* positions of prefixItems (each nests one group deeper) */

struct array_gen {
    const char **prefix; /* rule per prefix position, NULL: allows nothing */
    size_t n_prefix;
    const char *item;    /* NULL: no items past the prefix */
    int64_t min, max;    /* max -1: none */
};

/* Elements from position i on; the enclosing brackets are the caller's. Returns 0, or 1 when
 * no array of the allowed lengths can be made. */
static int array_tail(struct sconv *c, struct sbuf *b, const struct array_gen *a, size_t i)
{
    const char *comma = i ? "\",\" space " : "";
    if (a->max >= 0 && (int64_t)i >= a->max)
        return 0;
    if (i < a->n_prefix) {
        if (!a->prefix[i])
            return (int64_t)i < a->min; /* the array must end before i */
        int opt = (int64_t)i >= a->min;
        sb_printf(b, "%s%s%s", opt ? "(" : "", comma, a->prefix[i]);
        struct sbuf rest = {0};
        if (array_tail(c, &rest, a, i + 1)) {
            sb_free(&rest);
            return 1;
        }
        if (rest.n)
            sb_printf(b, " %s", rest.p);
        sb_free(&rest);
        sb_puts(b, opt ? ")?" : "");
        return 0;
    }
    if (!a->item)
        return (int64_t)i < a->min;
    int64_t min = a->min > (int64_t)i ? a->min - (int64_t)i : 0;
    int64_t max = a->max < 0 ? -1 : a->max - (int64_t)i;
    if (i == 0) {
        gen_repetition(b, a->item, min, max, "\",\" space");
    } else {
        char group[SCHEMA_NAME_MAX + 32];
        snprintf(group, sizeof group, "(\",\" space %s)", a->item);
        gen_repetition(b, group, min, max, NULL);
    }
    return 0;
}

static int gen_array(struct sconv *c, const struct sflat *f, const char *name, char **body)
{
    struct array_gen a = {0};
    struct sbuf b = {0};
    char sub[SCHEMA_NAME_MAX + 32], child_ptr[SCHEMA_PTR_MAX];
    const char *prefix = strcmp(name, "root") ? name : "";
    int rc = 0;
    *body = NULL;
    if (!f->prefix && !f->items && f->min_items == 0 && f->max_items < 0)
        return dup_name(c, rule_primitive(c, "array"), body);
    if (f->min_items > KWK_GRAMMAR_REPEAT_MAX || f->max_items > KWK_GRAMMAR_REPEAT_MAX)
        return too_many(c, f->max_items > KWK_GRAMMAR_REPEAT_MAX ? "maxItems" : "minItems",
                        f->ptr, KWK_MAX(f->min_items, f->max_items));
    a.n_prefix = f->prefix ? json_array_size(f->prefix) : 0;
    if (a.n_prefix > PREFIX_MAX)
        return sconv_fail(c, KWK_ELIMIT, "json schema: \"prefixItems\" at #%s: more than %d",
                          f->ptr, PREFIX_MAX);
    a.min = f->min_items;
    a.max = f->max_items;
    if (a.n_prefix && !(a.prefix = kwk_calloc(a.n_prefix, sizeof *a.prefix)))
        return sconv_fail(c, -ENOMEM, "out of memory");
    for (size_t i = 0; i < a.n_prefix && !rc; i++) {
        char idx[32];
        snprintf(idx, sizeof idx, "tuple-%zu", i);
        rule_name_join(sub, sizeof sub, prefix, idx);
        ptr_index(child_ptr, f->ptr, "prefixItems", i);
        rc = schema_visit(c, json_array_get(f->prefix, i), child_ptr, sub, &a.prefix[i]);
    }
    if (!rc) {
        rule_name_join(sub, sizeof sub, prefix, "item");
        ptr_child(child_ptr, f->ptr, "items");
        if (f->items)
            rc = schema_visit(c, f->items, child_ptr, sub, &a.item);
        else
            a.item = rule_primitive(c, "value");
    }
    if (!rc && rule_primitive(c, "space")) {
        struct sbuf tail = {0};
        if (!array_tail(c, &tail, &a, 0)) {
            sb_printf(&b, "\"[\" space %s%s\"]\" space", tail.p ? tail.p : "",
                      tail.n ? " " : "");
            rc = take(c, &b, body);
        }
        if (tail.err && !rc)
            rc = sconv_fail(c, tail.err, "the grammar would exceed the size limit");
        sb_free(&tail);
    }
    sb_free(&b);
    kwk_free(a.prefix);
    return rc ? rc : c->rc;
}

/* ---- objects ---- */

struct trie {
    uint32_t *cps;   /* children's code points */
    size_t *kids;    /* children's node indexes */
    size_t n, cap;
    int end;
};

struct trie_set {
    struct trie *nodes;
    size_t n, cap;
};

static int trie_node(struct trie_set *t, size_t *out)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        struct trie *v = kwk_realloc(t->nodes, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        t->nodes = v;
        t->cap = cap;
    }
    memset(&t->nodes[t->n], 0, sizeof t->nodes[t->n]);
    *out = t->n++;
    return 0;
}

static uint32_t utf8_next(const char **s)
{
    const unsigned char *p = (const unsigned char *)*s;
    uint32_t cp = *p++;
    int more = cp >= 0xF0 ? 3 : cp >= 0xE0 ? 2 : cp >= 0xC0 ? 1 : 0;
    if (more)
        cp &= 0x3F >> more;
    for (; more > 0 && (*p & 0xC0) == 0x80; more--)
        cp = cp << 6 | (*p++ & 0x3F);
    *s = (const char *)p;
    return cp;
}

static int trie_insert(struct trie_set *t, const char *name)
{
    size_t at = 0;
    while (*name) {
        uint32_t cp = utf8_next(&name);
        struct trie *node = &t->nodes[at];
        size_t k;
        for (k = 0; k < node->n && node->cps[k] != cp; k++)
            ;
        if (k == node->n) {
            size_t kid;
            if (trie_node(t, &kid))
                return -ENOMEM;
            node = &t->nodes[at]; /* nodes may have moved */
            if (node->n == node->cap) {
                size_t cap = node->cap ? node->cap * 2 : 4;
                uint32_t *cps = kwk_realloc(node->cps, cap * sizeof *cps);
                if (!cps)
                    return -ENOMEM;
                node->cps = cps;
                size_t *kids = kwk_realloc(node->kids, cap * sizeof *kids);
                if (!kids)
                    return -ENOMEM;
                node->kids = kids;
                node->cap = cap;
            }
            node->cps[node->n] = cp;
            node->kids[node->n++] = kid;
        }
        at = t->nodes[at].kids[k];
    }
    t->nodes[at].end = 1;
    return 0;
}

static void trie_free(struct trie_set *t)
{
    for (size_t i = 0; i < t->n; i++) {
        kwk_free(t->nodes[i].cps);
        kwk_free(t->nodes[i].kids);
    }
    kwk_free(t->nodes);
}

/* The alternatives for what may follow node at so that the key is no known name. */
static void trie_gen(struct sbuf *b, const struct trie_set *t, size_t at, int depth)
{
    const struct trie *node = &t->nodes[at];
    struct cpset other = {0};
    for (size_t k = 0; k < node->n; k++) {
        const struct trie *kid = &t->nodes[node->kids[k]];
        sb_puts(b, k ? " | " : "");
        gen_json_char_cp(b, node->cps[k]);
        if (!kid->n) {
            sb_puts(b, " key-char+");
        } else {
            sb_puts(b, " (");
            trie_gen(b, t, node->kids[k], depth + 1);
            sb_puts(b, kid->end ? ")" : ")?");
        }
        cpset_add(&other, node->cps[k], node->cps[k]);
    }
    cpset_normalize(&other);
    cpset_negate(&other);
    sb_puts(b, node->n ? " | (" : "(");
    cpset_gen_json_char(b, &other);
    sb_puts(b, ") key-char*");
}

#define KEY_NAME_MAX 256 /* code points of a known name when other keys are allowed */

/* A key that is none of names (a JSON list of strings). */
static int gen_other_key(struct sconv *c, const json_t *names, const char *rname,
                         const char **out)
{
    struct trie_set t = {0};
    struct sbuf b = {0};
    size_t root, i;
    json_t *v;
    char *body = NULL;
    int rc = trie_node(&t, &root);
    json_array_foreach(names, i, v)
    {
        if (rc)
            break;
        if (utf8_chars(json_string_value(v), json_string_length(v)) > KEY_NAME_MAX) {
            rc = sconv_fail(c, KWK_ELIMIT,
                            "json schema: a property name of over %d characters with other "
                            "properties allowed",
                            KEY_NAME_MAX);
            goto out;
        }
        rc = trie_insert(&t, json_string_value(v));
    }
    if (rc) {
        rc = sconv_fail(c, -ENOMEM, "out of memory");
        goto out;
    }
    if (!rule_primitive(c, "key-char") || !rule_primitive(c, "space"))
        goto out;
    sb_puts(&b, QUOTE " (");
    trie_gen(&b, &t, 0, 0);
    sb_puts(&b, t.nodes[0].end ? ") " QUOTE " space" : ")? " QUOTE " space");
    if ((rc = take(c, &b, &body)))
        goto out;
    *out = rule_add(c, rname, body);
out:
    kwk_free(body);
    sb_free(&b);
    trie_free(&t);
    return rc ? rc : c->rc;
}

struct slot {
    const char *kv;  /* the key-value rule */
    const char *key; /* for rule names */
    int required;
};

struct object_gen {
    struct slot *slots;
    size_t n;
    json_t *known;   /* every name the schema lists (a value of theirs is never "other") */
    const char *add; /* the rule of other key-value pairs, or NULL */
    int never;
};

static int object_slot(struct sconv *c, struct object_gen *o, const struct sflat *f,
                       const char *prefix, const char *key, json_t *schema, int required)
{
    char sub[SCHEMA_NAME_MAX + 32], ptr[SCHEMA_PTR_MAX], mid[SCHEMA_PTR_MAX];
    const char *value;
    struct sbuf b = {0};
    char *kv_body = NULL;
    json_t *k = json_string(key);
    char *text = k ? json_dumps(k, JSON_ENCODE_ANY) : NULL;
    json_decref(k);
    int rc = 0;
    if (!text || json_array_append_new(o->known, json_string(key)))
        rc = sconv_fail(c, -ENOMEM, "out of memory");
    ptr_child(mid, f->ptr, "properties");
    ptr_child(ptr, mid, key);
    rule_name_join(sub, sizeof sub, prefix, key);
    if (!rc && schema)
        rc = schema_visit(c, schema, ptr, sub, &value);
    else if (!rc)
        value = rule_primitive(c, "value");
    if (rc)
        goto out;
    if (!value) {
        o->never |= required;
        goto out;
    }
    sb_literal(&b, text, strlen(text));
    sb_printf(&b, " space \":\" space %s", value);
    if ((rc = take(c, &b, &kv_body)))
        goto out;
    rule_name_join(sub, sizeof sub, prefix, key);
    strncat(sub, "-kv", sizeof sub - strlen(sub) - 1);
    const char *kv = rule_add(c, sub, kv_body);
    if (!kv)
        goto out;
    struct slot *s = &o->slots[o->n++];
    s->kv = kv;
    s->key = key;
    s->required = required;
out:
    free(text);
    kwk_free(kv_body);
    sb_free(&b);
    return rc ? rc : c->rc;
}

static int json_list_has(const json_t *list, const char *s)
{
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v) if (strcmp(json_string_value(v), s) == 0) return 1;
    return 0;
}

static int object_additional(struct sconv *c, struct object_gen *o, const struct sflat *f,
                             const char *prefix)
{
    char sub[SCHEMA_NAME_MAX + 32], ptr[SCHEMA_PTR_MAX];
    const char *value = NULL, *key = NULL;
    struct sbuf b = {0};
    char *body = NULL;
    int rc = 0;
    if (json_is_false(f->addl))
        return 0;
    rule_name_join(sub, sizeof sub, prefix, "additional-value");
    ptr_child(ptr, f->ptr, "additionalProperties");
    if (f->addl)
        rc = schema_visit(c, f->addl, ptr, sub, &value);
    else
        value = rule_primitive(c, "value");
    if (rc || !value)
        return c->rc;
    rule_name_join(sub, sizeof sub, prefix, "additional-k");
    if (json_array_size(o->known))
        rc = gen_other_key(c, o->known, sub, &key);
    else
        key = rule_primitive(c, "string");
    if (rc || !key)
        return c->rc;
    sb_printf(&b, "%s \":\" space %s", key, value);
    if ((rc = take(c, &b, &body)))
        return rc;
    rule_name_join(sub, sizeof sub, prefix, "additional-kv");
    o->add = rule_add(c, sub, body);
    kwk_free(body);
    return c->rc;
}

/* llama.cpp's shape, keeping the schema's order: the first key present is one of the slots up
 * to the first required one; each slot's rest is a rule of its own once optional slots follow,
 * so the grammar stays linear in the number of properties. */
static int object_body(struct sconv *c, const struct object_gen *o, const char *prefix,
                       char **body)
{
    char **rest = kwk_calloc(o->n + 1, sizeof *rest);
    struct sbuf b = {0};
    int rc = 0, all_opt = 1;
    char add_piece[SCHEMA_NAME_MAX + 48] = "";
    if (!rest)
        return sconv_fail(c, -ENOMEM, "out of memory");
    if (o->add)
        snprintf(add_piece, sizeof add_piece, "( \",\" space %s )*", o->add);
    int opt_after = 0; /* an optional slot follows slot i */
    for (size_t i = o->n; i-- > 0 && !rc;) {
        struct sbuf t = {0};
        if (i + 1 == o->n) {
            sb_puts(&t, add_piece);
        } else {
            const struct slot *s = &o->slots[i + 1];
            sb_printf(&t, s->required ? "\",\" space %s" : "( \",\" space %s )?", s->kv);
            if (rest[i + 1] && rest[i + 1][0])
                sb_printf(&t, " %s", rest[i + 1]);
            opt_after |= !s->required;
        }
        if ((rc = take(c, &t, &rest[i])))
            break;
        if (opt_after && i + 1 < o->n && rest[i][0]) {
            char sub[SCHEMA_NAME_MAX + 32];
            rule_name_join(sub, sizeof sub, prefix, o->slots[i].key);
            strncat(sub, "-rest", sizeof sub - strlen(sub) - 1);
            const char *r = rule_add(c, sub, rest[i]);
            kwk_free(rest[i]);
            rest[i] = r ? kwk_strdup(r) : NULL;
            if (!rest[i])
                rc = c->rc ? c->rc : sconv_fail(c, -ENOMEM, "out of memory");
        }
    }
    if (rc)
        goto out;
    sb_puts(&b, "\"{\" space ");
    struct sbuf alts = {0};
    int n_alts = 0;
    for (size_t i = 0; i < o->n; i++) {
        sb_printf(&alts, "%s%s%s%s", n_alts++ ? " | " : "", o->slots[i].kv,
                  rest[i][0] ? " " : "", rest[i]);
        if (o->slots[i].required) {
            all_opt = 0;
            break;
        }
    }
    if (all_opt && o->add)
        sb_printf(&alts, "%s%s %s", n_alts++ ? " | " : "", o->add, add_piece);
    if (n_alts == 1 && !all_opt)
        sb_printf(&b, "%s ", alts.p);
    else if (n_alts)
        sb_printf(&b, "( %s )%s ", alts.p, all_opt ? "?" : "");
    sb_free(&alts);
    sb_puts(&b, "\"}\" space");
    rc = take(c, &b, body);
out:
    for (size_t i = 0; i <= o->n; i++)
        kwk_free(rest[i]);
    kwk_free(rest);
    sb_free(&b);
    return rc;
}

static int gen_object(struct sconv *c, const struct sflat *f, const char *name, char **body)
{
    struct object_gen o = {0};
    const char *prefix = strcmp(name, "root") ? name : "";
    const char *k;
    json_t *v;
    size_t i;
    int rc = 0;
    *body = NULL;
    if (!f->props && !f->required && !f->addl)
        return dup_name(c, rule_primitive(c, "object"), body);
    size_t cap = (f->props ? json_object_size(f->props) : 0) +
                 (f->required ? json_array_size(f->required) : 0);
    o.slots = kwk_calloc(cap ? cap : 1, sizeof *o.slots);
    o.known = json_array();
    if (!o.slots || !o.known) {
        rc = sconv_fail(c, -ENOMEM, "out of memory");
        goto out;
    }
    if (f->props) {
        json_object_foreach(f->props, k, v)
        {
            int req = f->required && json_list_has(f->required, k);
            if ((rc = object_slot(c, &o, f, prefix, k, v, req)))
                goto out;
        }
    }
    /* required names the properties do not list: there, with additionalProperties' schema */
    if (f->required) {
        json_array_foreach(f->required, i, v)
        {
            const char *name_i = json_string_value(v);
            if (json_list_has(o.known, name_i))
                continue;
            if (json_is_false(f->addl)) {
                o.never = 1;
                break;
            }
            if ((rc = object_slot(c, &o, f, prefix, name_i, f->addl, 1)))
                goto out;
        }
    }
    if (o.never)
        goto out;
    if ((rc = object_additional(c, &o, f, prefix)))
        goto out;
    if (!rule_primitive(c, "space"))
        goto out;
    rc = object_body(c, &o, prefix, body);
out:
    kwk_free(o.slots);
    json_decref(o.known);
    return rc ? rc : c->rc;
}

/* ---- one alternative ---- */

struct part {
    const char *suffix;
    char *body;
};

int schema_gen_flat(struct sconv *c, const struct sflat *f, const char *name, char **body,
                    int *is_name)
{
    struct part parts[6] = {{"null", NULL},   {"boolean", NULL}, {"number", NULL},
                            {"string", NULL}, {"array", NULL},   {"object", NULL}};
    struct sbuf b = {0};
    int rc = 0, n = 0, simple = 1;
    *body = NULL;
    *is_name = 0;
    if (f->enum_vals)
        return gen_enum(c, f, name, body);
    unsigned t = f->types;
    if (t & T_NULL)
        rc = dup_name(c, rule_primitive(c, "null"), &parts[0].body);
    if (!rc && (t & T_BOOL))
        rc = dup_name(c, rule_primitive(c, "boolean"), &parts[1].body);
    if (!rc && (t & (T_INTEGER | T_NUMBER)))
        rc = gen_number(c, f, &parts[2].body);
    if (!rc && (t & T_STRING))
        rc = gen_string(c, f, name, &parts[3].body);
    if (!rc && (t & T_ARRAY))
        rc = gen_array(c, f, name, &parts[4].body);
    if (!rc && (t & T_OBJECT))
        rc = gen_object(c, f, name, &parts[5].body);
    for (int i = 0; i < 6; i++) {
        n += parts[i].body != NULL;
        if (parts[i].body && strcmp(parts[i].body, parts[i].suffix) != 0)
            simple = 0;
    }
    if (rc || !n)
        goto out;
    if (n == 6 && simple && (t & T_NUMBER)) {
        *body = kwk_strdup(rule_primitive(c, "value"));
        *is_name = 1;
        if (!*body)
            rc = sconv_fail(c, -ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < 6; i++) {
        if (!parts[i].body)
            continue;
        const char *piece = parts[i].body;
        int plain = strchr(piece, ' ') == NULL;
        if (n == 1) {
            *body = parts[i].body;
            parts[i].body = NULL;
            *is_name = plain;
            goto out;
        }
        if (!plain) {
            char sub[SCHEMA_NAME_MAX + 16];
            rule_name_join(sub, sizeof sub, name, parts[i].suffix);
            if (!(piece = rule_add(c, sub, piece)))
                goto out;
        }
        sb_printf(&b, "%s%s", b.n ? " | " : "", piece);
    }
    *is_name = 0;
    rc = take(c, &b, body);
out:
    for (int i = 0; i < 6; i++)
        kwk_free(parts[i].body);
    sb_free(&b);
    return rc ? rc : c->rc;
}
