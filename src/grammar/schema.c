/* schema.c - JSON Schema to GBNF: the public entry point, the rule table, the shared primitive
 * rules and the visit of one subschema (cached by content so that recursion closes). Thread-
 * safe: each call owns its conversion state.
 *
 * What the grammar means. It accepts only instances the schema accepts (a keyword it cannot
 * hold is refused, never dropped), and every valid instance in one spelling: compact or
 * indented, an object's keys in the schema's order (properties, then required names it does
 * not list, then other keys), strings as jansson writes them where a pattern or a key must be
 * told apart (raw UTF-8, the short escapes), integers without a fraction (1.0 is an integer
 * to JSON Schema, but a client would read a float). Decisions:
 *  - oneOf converts only where no value can match two branches (types, enums, lengths,
 *    integer ranges or a required const discriminator tell them apart): else refused.
 *  - `false` (or a schema that allows nothing) is dropped where it leaves something (an
 *    optional property, a branch, items past prefixItems) and refused at the root.
 *  - format: date, time, date-time and uuid are asserted (llama.cpp's rules: days up to 31
 *    in any month; time with 3 fraction digits or none); other formats are refused.
 *  - numeric bounds only on integers (ranges to 64 bits); on other numbers they are refused.
 *  - $ref: "#" and "#/..." pointers in this document (and the root's own $id); remote refs,
 *    anchors and references inside embedded $id resources are refused. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/schema.h"

int sconv_step(struct sconv *c)
{
    if (++c->steps > SCHEMA_STEPS_MAX)
        return sconv_fail(c, KWK_ELIMIT, "the schema needs more than %d steps to convert",
                          SCHEMA_STEPS_MAX);
    return 0;
}

int sconv_fail(struct sconv *c, int code, const char *fmt, ...)
{
    if (c->rc)
        return c->rc;
    c->rc = code;
    if (c->err) {
        va_list ap;
        va_start(ap, fmt);
        kwk_err_clear(c->err);
        c->err->code = code;
        c->err->pos = -1;
        vsnprintf(c->err->msg, sizeof c->err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void ptr_child(char *out, const char *ptr, const char *token)
{
    char tmp[SCHEMA_PTR_MAX];
    size_t n = (size_t)snprintf(tmp, sizeof tmp, "%s/", ptr);
    for (const char *t = token; *t && n + 4 < sizeof tmp; t++) {
        if (*t == '~' || *t == '/') {
            tmp[n++] = '~';
            tmp[n++] = *t == '~' ? '0' : '1';
        } else {
            tmp[n++] = *t;
        }
    }
    if (n + 4 >= sizeof tmp)
        memcpy(tmp + sizeof tmp - 4, "...", 4);
    else
        tmp[n] = 0;
    memcpy(out, tmp, sizeof tmp);
}

void ptr_index(char *out, const char *ptr, const char *kw, size_t i)
{
    char tok[48];
    char mid[SCHEMA_PTR_MAX];
    ptr_child(mid, ptr, kw);
    snprintf(tok, sizeof tok, "%zu", i);
    ptr_child(out, mid, tok);
}

/* ---- a small string map: FNV-1a, open addressing, capacity a power of two ---- */

static uint64_t str_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static size_t *smap_slot(struct smap *m, const char *key)
{
    size_t i = (size_t)str_hash(key) & (m->cap - 1);
    while (m->keys[i] && strcmp(m->keys[i], key) != 0)
        i = (i + 1) & (m->cap - 1);
    return &m->vals[i];
}

static int smap_get(const struct smap *m, const char *key, size_t *val)
{
    if (!m->cap)
        return 0;
    size_t i = (size_t)str_hash(key) & (m->cap - 1);
    for (; m->keys[i]; i = (i + 1) & (m->cap - 1)) {
        if (strcmp(m->keys[i], key) == 0) {
            *val = m->vals[i];
            return 1;
        }
    }
    return 0;
}

static int smap_grow(struct smap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    struct smap nm = {kwk_calloc(cap, sizeof(char *)), kwk_calloc(cap, sizeof(size_t)), cap, 0};
    if (!nm.keys || !nm.vals) {
        kwk_free(nm.keys);
        kwk_free(nm.vals);
        return -ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i])
            continue;
        size_t *slot = smap_slot(&nm, m->keys[i]);
        nm.keys[slot - nm.vals] = m->keys[i];
        *slot = m->vals[i];
        nm.n++;
    }
    kwk_free(m->keys);
    kwk_free(m->vals);
    *m = nm;
    return 0;
}

/* Insert key (copied) -> val; the key must be absent. */
static int smap_put(struct smap *m, const char *key, size_t val)
{
    if ((m->n + 1) * 2 > m->cap && smap_grow(m))
        return -ENOMEM;
    char *k = kwk_strdup(key);
    if (!k)
        return -ENOMEM;
    size_t *slot = smap_slot(m, key);
    m->keys[slot - m->vals] = k;
    *slot = val;
    m->n++;
    return 0;
}

static void smap_free(struct smap *m)
{
    for (size_t i = 0; i < m->cap; i++)
        kwk_free(m->keys[i]);
    kwk_free(m->keys);
    kwk_free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- rules ---- */

void rule_name_join(char *out, size_t cap, const char *prefix, const char *suffix)
{
    size_t n = 0;
    int dash = 0; /* a run of other characters becomes one '-' */
    const char *parts[2] = {prefix, suffix};
    for (int p = 0; p < 2; p++) {
        if (p == 1 && n > 0 && suffix[0])
            dash = 1;
        for (const char *s = parts[p]; *s && n + 2 < cap && n + 2 < SCHEMA_NAME_MAX; s++) {
            char ch = *s;
            int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                     (ch >= '0' && ch <= '9') || ch == '-';
            if (!ok) {
                dash = 1;
                continue;
            }
            if (dash && n > 0)
                out[n++] = '-';
            dash = 0;
            out[n++] = ch;
        }
    }
    if (n == 0)
        n = (size_t)snprintf(out, cap, "%s", "prop");
    out[n] = 0;
}

static int rule_push(struct sconv *c, const char *name, const char *body, size_t *index)
{
    if (c->n_rules == c->cap_rules) {
        size_t cap = c->cap_rules ? c->cap_rules * 2 : 32;
        struct srule *r = kwk_realloc(c->rules, cap * sizeof *r);
        if (!r)
            return sconv_fail(c, -ENOMEM, "out of memory");
        c->rules = r;
        c->cap_rules = cap;
    }
    struct srule *r = &c->rules[c->n_rules];
    memset(r, 0, sizeof *r);
    r->name = kwk_strdup(name);
    r->body = body ? kwk_strdup(body) : NULL;
    if (!r->name || (body && !r->body)) {
        kwk_free(r->name);
        kwk_free(r->body);
        return sconv_fail(c, -ENOMEM, "out of memory");
    }
    if (smap_put(&c->rule_index, name, c->n_rules)) {
        kwk_free(r->name);
        kwk_free(r->body);
        return sconv_fail(c, -ENOMEM, "out of memory");
    }
    if (body)
        c->text_size += strlen(body) + strlen(name) + 6;
    if (c->text_size > KWK_GRAMMAR_TEXT_MAX)
        sconv_fail(c, KWK_ELIMIT, "the grammar would exceed %d bytes", KWK_GRAMMAR_TEXT_MAX);
    *index = c->n_rules++;
    return c->rc;
}

/* The first of name, name0, name1 ... that is free (or, with body, holds body). */
static int rule_pick(struct sconv *c, const char *name, const char *body, char *out,
                     size_t cap, int *exists)
{
    *exists = 0;
    for (long i = -1; i < 100000; i++) {
        if (i < 0)
            snprintf(out, cap, "%s", name);
        else
            snprintf(out, cap, "%s%ld", name, i);
        /* each name tried is a step: many properties whose names map to one rule name (no
         * letters or digits) would otherwise make this quadratic */
        if (sconv_step(c))
            return c->rc;
        size_t at;
        if (!smap_get(&c->rule_index, out, &at))
            return 0;
        const struct srule *r = &c->rules[at];
        if (body && r->body && !r->dead && strcmp(r->body, body) == 0) {
            *exists = 1;
            return 0;
        }
    }
    return sconv_fail(c, KWK_ELIMIT, "too many rules named %s", name);
}

const char *rule_add(struct sconv *c, const char *name, const char *body)
{
    char pick[SCHEMA_NAME_MAX + 16];
    int exists;
    size_t at = 0;
    if (c->rc || rule_pick(c, name, body, pick, sizeof pick, &exists))
        return NULL;
    if (exists) {
        smap_get(&c->rule_index, pick, &at);
        return c->rules[at].name;
    }
    if (rule_push(c, pick, body, &at))
        return NULL;
    return c->rules[at].name;
}

static int rule_reserve(struct sconv *c, const char *name, size_t *index)
{
    char pick[SCHEMA_NAME_MAX + 16];
    int exists;
    if (c->rc || rule_pick(c, name, NULL, pick, sizeof pick, &exists))
        return c->rc;
    return rule_push(c, pick, NULL, index);
}

static int rule_set_body(struct sconv *c, size_t at, const char *body)
{
    c->rules[at].body = kwk_strdup(body);
    if (!c->rules[at].body)
        return sconv_fail(c, -ENOMEM, "out of memory");
    c->text_size += strlen(body) + strlen(c->rules[at].name) + 6;
    if (c->text_size > KWK_GRAMMAR_TEXT_MAX)
        return sconv_fail(c, KWK_ELIMIT, "the grammar would exceed %d bytes",
                          KWK_GRAMMAR_TEXT_MAX);
    return 0;
}

/* ---- primitives: the shapes of llama.cpp's converter, with JSON's full string escapes.
 * Integers are written without a fraction: JSON Schema counts 1.0 as an integer, but a client
 * reading the reply (Python's json, a strict int field) would get a float ---- */

struct primitive {
    const char *name, *body, *deps[3];
};

#define HEX "[0-9a-fA-F]"
static const struct primitive primitives[] = {
    {"space", "| \" \" | \"\\n\" [ \\t]{0,20}", {0}},
    {"boolean", "(\"true\" | \"false\") space", {"space"}},
    {"null", "\"null\" space", {"space"}},
    {"integral-part", "[0] | [1-9] [0-9]{0,15}", {0}},
    {"decimal-part", "[0-9]{1,16}", {0}},
    {"number",
     "\"-\"? integral-part (\".\" decimal-part)? ([eE] [-+]? decimal-part)? space",
     {"integral-part", "decimal-part", "space"}},
    {"integer", "\"-\"? integral-part space", {"integral-part", "space"}},
    /* one character: a surrogate pair's two escapes count as one, a lone surrogate is none */
    {"char",
     "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-CefEF] " HEX "{3} | "
     "[dD] [0-7] " HEX "{2} | [dD] [89abAB] " HEX "{2} \"\\\\u\" [dD] [c-fC-F] " HEX "{2}))",
     {0}},
    /* one character of a key spelled the one way jansson writes it, so that a key that is not
     * a known name cannot be a known name in disguise (\u0061 for a) */
    {"key-char",
     "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\bfnrt] | \"u00\" (\"0\" [0-7bBeEfF] | \"1\" " HEX
     "))",
     {0}},
    {"string", "\"\\\"\" char* \"\\\"\" space", {"char", "space"}},
    {"value", "object | array | string | number | boolean | null",
     {"object", "array", "string"}},
    {"object",
     "\"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? \"}\" "
     "space",
     {"string", "value", "space"}},
    {"array", "\"[\" space ( value (\",\" space value)* )? \"]\" space", {"value", "space"}},
    {"uuid",
     "\"\\\"\" " HEX "{8} \"-\" " HEX "{4} \"-\" " HEX "{4} \"-\" " HEX "{4} \"-\" " HEX
     "{12} \"\\\"\" space",
     {"space"}},
    {"date", "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [1-2] [0-9] | "
             "\"3\" [0-1] )",
     {0}},
    {"time", "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{3} "
             ")? ( \"Z\" | ( \"+\" | \"-\" ) ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )",
     {0}},
    {"date-time", "date \"T\" time", {"date", "time"}},
    {"date-string", "\"\\\"\" date \"\\\"\" space", {"date", "space"}},
    {"time-string", "\"\\\"\" time \"\\\"\" space", {"time", "space"}},
    {"date-time-string", "\"\\\"\" date-time \"\\\"\" space", {"date-time", "space"}},
};

static const struct primitive *primitive_find(const char *name)
{
    for (size_t i = 0; i < KWK_ARRAY_LEN(primitives); i++)
        if (strcmp(primitives[i].name, name) == 0)
            return &primitives[i];
    return NULL;
}

const char *rule_primitive(struct sconv *c, const char *name)
{
    const struct primitive *p = primitive_find(name);
    size_t at;
    if (!p || c->rc)
        return NULL;
    if (smap_get(&c->rule_index, name, &at))
        return c->rules[at].name;
    if (rule_push(c, name, p->body, &at))
        return NULL;
    for (int i = 0; i < 3 && p->deps[i]; i++)
        if (!rule_primitive(c, p->deps[i]))
            return NULL;
    /* value's own alternatives that are not listed as deps */
    if (strcmp(name, "value") == 0 &&
        (!rule_primitive(c, "number") || !rule_primitive(c, "boolean") ||
         !rule_primitive(c, "null")))
        return NULL;
    return c->rules[at].name;
}

/* ---- visiting a subschema ---- */

static int cache_add(struct sconv *c, const char *key, size_t *index)
{
    if (c->n_cache == c->cap_cache) {
        size_t cap = c->cap_cache ? c->cap_cache * 2 : 32;
        struct scache_entry *e = kwk_realloc(c->cache, cap * sizeof *e);
        if (!e)
            return sconv_fail(c, -ENOMEM, "out of memory");
        c->cache = e;
        c->cap_cache = cap;
    }
    c->cache[c->n_cache].rule = NULL;
    if (smap_put(&c->cache_index, key, c->n_cache))
        return sconv_fail(c, -ENOMEM, "out of memory");
    *index = c->n_cache++;
    return 0;
}

static int is_annotation(const char *k)
{
    static const char *const words[] = {"title", "description", "examples", "default",
                                        "$comment", "$schema", "deprecated", "readOnly",
                                        "writeOnly", "$anchor", "$dynamicAnchor", "$defs",
                                        "definitions"};
    for (size_t i = 0; i < KWK_ARRAY_LEN(words); i++)
        if (strcmp(k, words[i]) == 0)
            return 1;
    return 0;
}

/* A schema that is only a $ref (and annotations) is named after its target, as llama.cpp
 * does: {"$ref": "#/$defs/node"} -> ref-defs-node. */
int schema_pure_ref(json_t *s, char *out, size_t cap)
{
    const char *k;
    json_t *v;
    json_t *ref = json_object_get(s, "$ref");
    if (!json_is_string(ref))
        return 0;
    json_object_foreach(s, k, v)
    {
        if (strcmp(k, "$ref") != 0 && !is_annotation(k))
            return 0;
    }
    const char *frag = strchr(json_string_value(ref), '#');
    rule_name_join(out, cap, "ref", frag ? frag + 1 : json_string_value(ref));
    return 1;
}

static int name_reserved(const char *name)
{
    return strcmp(name, "root") == 0 || primitive_find(name) != NULL;
}

/* The union of the bodies of a schema's alternatives, each of several in a rule of its own. */
static int visit_union(struct sconv *c, struct sflist *alts, const char *name, char **body)
{
    struct sbuf b = {0};
    int n = 0, rc = 0;
    *body = NULL;
    for (size_t i = 0; i < alts->n && !rc; i++) {
        char sub[SCHEMA_NAME_MAX + 24], idx[24];
        char *alt = NULL;
        int is_name = 0;
        snprintf(idx, sizeof idx, "%zu", i);
        if (alts->n == 1)
            snprintf(sub, sizeof sub, "%s", name);
        else
            rule_name_join(sub, sizeof sub, strcmp(name, "root") ? name : "alternative", idx);
        if (alts->v[i]->whole) {
            const char *r = NULL;
            rc = schema_visit(c, alts->v[i]->whole, alts->v[i]->ptr, sub, &r);
            if (!rc && r)
                sb_printf(&b, "%s%s", n++ ? " | " : "", r);
            continue;
        }
        rc = schema_gen_flat(c, alts->v[i], sub, &alt, &is_name);
        if (rc || !alt)
            continue;
        const char *piece = alt;
        if (alts->n > 1 && !is_name)
            piece = rule_add(c, sub, alt);
        if (piece)
            sb_printf(&b, "%s%s", n++ ? " | " : "", piece);
        kwk_free(alt);
    }
    rc = rc ? rc : c->rc;
    if (!rc && n)
        *body = sb_take(&b, &rc);
    sb_free(&b);
    return rc ? sconv_fail(c, rc, "out of memory or the grammar is too large") : 0;
}

int schema_visit(struct sconv *c, json_t *s, const char *ptr, const char *name,
                 const char **out)
{
    char *key = NULL, *body = NULL;
    char rname[SCHEMA_NAME_MAX + 8];
    struct sflist alts = {0};
    size_t ci = 0, ri = 0;
    int rc = 0;
    *out = NULL;
    if (c->rc)
        return c->rc;
    if (sconv_step(c))
        return c->rc;
    /* a pure $ref is its target, wherever it is written */
    if (schema_pure_ref(s, rname, sizeof rname)) {
        const char *ref = json_string_value(json_object_get(s, "$ref"));
        size_t n = strlen(ref) + 6;
        if ((key = malloc(n)))
            snprintf(key, n, "$ref:%s", ref);
    } else {
        key = json_dumps(s, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        snprintf(rname, sizeof rname, "%s", name);
    }
    if (!key)
        return sconv_fail(c, -ENOMEM, "out of memory");
    /* a large subschema reached from many places is written out at every visit */
    c->dumped += strlen(key);
    if (c->dumped > SCHEMA_DUMP_MAX) {
        free(key);
        return sconv_fail(c, KWK_ELIMIT, "the schema's subschemas add up to more than %d bytes "
                          "to compare", SCHEMA_DUMP_MAX);
    }
    if (smap_get(&c->cache_index, key, &ci)) {
        *out = c->cache[ci].rule;
        goto out_key;
    }
    if (c->visit_depth >= SCHEMA_DEPTH_MAX) {
        rc = sconv_fail(c, KWK_ELIMIT, "json schema at #%s: values nested deeper than %d", ptr,
                        SCHEMA_DEPTH_MAX);
        goto out_key;
    }
    if (name_reserved(rname) && strcmp(name, "root") != 0)
        strcat(rname, "-");
    /* Reserved before its content is made: a recursive reference to s names this rule. */
    if ((rc = rule_reserve(c, rname, &ri)) || (rc = cache_add(c, key, &ci)))
        goto out_key;
    c->cache[ci].rule = c->rules[ri].name;
    int saved_base = c->inline_base, saved_top = c->flat_top;
    c->inline_base = c->n_inlining;
    c->flat_top = c->depth + 1;
    c->visit_depth++;
    rc = schema_flatten(c, s, ptr, &alts);
    c->flat_top = saved_top;
    if (!rc)
        rc = visit_union(c, &alts, c->rules[ri].name, &body);
    c->visit_depth--;
    c->inline_base = saved_base;
    if (rc)
        goto out_alts;
    if (!body) {
        /* Allows nothing. A recursive reference made while it was pending keeps an empty
         * rule (a grammar whose sentences would be infinite accepts nothing). */
        c->cache[ci].rule = NULL;
        c->rules[ri].dead = 1;
        goto out_alts;
    }
    rc = rule_set_body(c, ri, body);
    *out = c->rules[ri].name;
out_alts:
    for (size_t i = 0; i < alts.n; i++)
        sflat_free(alts.v[i]);
    kwk_free(alts.v);
    kwk_free(body);
out_key:
    free(key); /* json_dumps allocates with jansson's allocator (malloc) */
    return rc ? rc : c->rc;
}

/* ---- the whole conversion ---- */

static int has_key_anywhere(const json_t *j, const char *key, int depth)
{
    const char *k;
    json_t *v;
    size_t i;
    if (depth > 2100)
        return 1;
    if (json_is_object(j)) {
        json_object_foreach((json_t *)j, k, v)
        {
            if (strcmp(k, key) == 0 || has_key_anywhere(v, key, depth + 1))
                return 1;
        }
    } else if (json_is_array(j)) {
        json_array_foreach(j, i, v)
        {
            if (has_key_anywhere(v, key, depth + 1))
                return 1;
        }
    }
    return 0;
}

static int rule_cmp(const void *a, const void *b)
{
    const struct srule *x = *(const struct srule *const *)a, *y = *(const struct srule *const *)b;
    return strcmp(x->name, y->name);
}

/* root first, then the others by name (the order llama.cpp prints, root apart). */
static int grammar_print(struct sconv *c, char **out, size_t *out_len)
{
    struct srule **order = kwk_calloc(c->n_rules ? c->n_rules : 1, sizeof *order);
    struct sbuf b = {0};
    size_t n = 0;
    int rc = 0;
    if (!order)
        return sconv_fail(c, -ENOMEM, "out of memory");
    for (size_t i = 0; i < c->n_rules; i++) {
        struct srule *r = &c->rules[i];
        if (r->dead || strcmp(r->name, "root") == 0)
            continue;
        if (!r->body) {
            rc = sconv_fail(c, KWK_ERUNTIME, "internal: rule %s has no body", r->name);
            goto out;
        }
        order[n++] = r;
    }
    qsort(order, n, sizeof *order, rule_cmp);
    for (size_t i = 0; i < c->n_rules; i++)
        if (!c->rules[i].dead && strcmp(c->rules[i].name, "root") == 0)
            sb_printf(&b, "root ::= %s\n", c->rules[i].body);
    for (size_t i = 0; i < n; i++)
        sb_printf(&b, "%s ::= %s\n", order[i]->name, order[i]->body);
    size_t len = b.n;
    *out = sb_take(&b, &rc);
    if (rc) {
        sconv_fail(c, rc, rc == KWK_ELIMIT ? "the grammar would exceed the size limit"
                                           : "out of memory");
        goto out;
    }
    *out_len = len;
out:
    kwk_free(order);
    sb_free(&b);
    return c->rc;
}

static void sconv_clear(struct sconv *c)
{
    for (size_t i = 0; i < c->n_rules; i++) {
        kwk_free(c->rules[i].name);
        kwk_free(c->rules[i].body);
    }
    kwk_free(c->rules);
    kwk_free(c->cache);
    smap_free(&c->rule_index);
    smap_free(&c->cache_index);
    json_decref(c->root);
}

int kwk_json_schema_to_gbnf(const char *schema, size_t len, char **out, size_t *out_len,
                            struct kwk_err *err)
{
    struct sconv c = {0};
    json_error_t je;
    const char *root_rule = NULL;
    size_t dummy_len;
    c.err = err;
    if (!out)
        return kwk_err_set(err, KWK_EARG, "json schema: no output pointer");
    *out = NULL;
    if (!out_len)
        out_len = &dummy_len;
    *out_len = 0;
    if (!schema && len)
        return kwk_err_set(err, KWK_EARG, "json schema: NULL text");
    if (len > KWK_GRAMMAR_TEXT_MAX)
        return kwk_err_set(err, KWK_ELIMIT, "json schema: %zu bytes, over the limit of %d", len,
                           KWK_GRAMMAR_TEXT_MAX);
    c.root = json_loadb(schema ? schema : "", len,
                        JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!c.root) {
        kwk_err_set_pos(err, KWK_EFORMAT, je.position, "json schema:%d:%d: %s", je.line,
                        je.column, je.text);
        if (err) {
            err->line = je.line;
            err->col = je.column;
        }
        return KWK_EFORMAT;
    }
    c.has_ref = has_key_anywhere(c.root, "$ref", 0);
    if (schema_visit(&c, c.root, "", "root", &root_rule) == 0 && !root_rule)
        sconv_fail(&c, KWK_EUNSUPPORTED, "json schema at #: the schema allows no value, so "
                                         "no grammar can be made for it");
    if (!c.rc && strcmp(root_rule, "root") != 0) {
        /* the root's rule got another name (a pure $ref): alias it */
        if (!rule_add(&c, "root", root_rule))
            sconv_fail(&c, KWK_ERUNTIME, "internal: the root rule is taken");
    }
    if (!c.rc)
        grammar_print(&c, out, out_len);
    sconv_clear(&c);
    return c.rc;
}
