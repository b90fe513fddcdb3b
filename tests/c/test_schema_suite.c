/* test_schema_suite.c - the official JSON-Schema test suite (draft 2020-12) through
 * kwk_grammar_from_json_schema and kwk_grammar_match: every schema is converted; a refusal
 * (KWK_EUNSUPPORTED) is counted, a conversion must accept each valid instance and reject each
 * invalid one. Instances are written compactly in the order the grammar expects: an object's
 * keys as the schemas that apply to it list them (properties, then required names), other keys
 * after, in their own order. The suite is read from $KWKER_SHARED_DATA/json-schema-test-suite,
 * else ../shared/data/json-schema-test-suite (ctest runs in the checkout). */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwker.h"
#include "test.h"

#define MAX_APPLY 256 /* subschemas that apply to one value */
#define MAX_KEYS 256  /* keys of one object instance */

/* ---- which subschemas apply to a value: $ref, allOf, anyOf, oneOf expanded ---- */

struct apply {
    json_t *v[MAX_APPLY];
    int n;
};

static json_t *resolve(json_t *root, const char *ref)
{
    json_t *id = json_object_get(root, "$id");
    if (json_is_string(id) && strncmp(ref, json_string_value(id), strlen(json_string_value(id))) == 0)
        ref += strlen(json_string_value(id));
    if (ref[0] == 0 || strcmp(ref, "#") == 0)
        return root;
    if (strncmp(ref, "#/", 2) != 0)
        return NULL;
    json_t *cur = root;
    const char *p = ref + 1;
    while (cur && *p == '/') {
        char tok[256];
        size_t n = 0;
        for (p++; *p && *p != '/' && n + 1 < sizeof tok; p++) {
            char ch = *p;
            if (ch == '~' && p[1])
                ch = *++p == '0' ? '~' : '/';
            else if (ch == '%' && p[1] && p[2]) {
                unsigned x;
                char hx[3] = {p[1], p[2], 0};
                if (sscanf(hx, "%2x", &x) == 1) {
                    ch = (char)x;
                    p += 2;
                }
            }
            tok[n++] = ch;
        }
        tok[n] = 0;
        cur = json_is_object(cur)  ? json_object_get(cur, tok)
              : json_is_array(cur) ? json_array_get(cur, strtoul(tok, NULL, 10))
                                   : NULL;
    }
    return cur;
}

static void apply_add(json_t *root, struct apply *a, json_t *s, int depth)
{
    if (!json_is_object(s) || depth > 16 || a->n == MAX_APPLY)
        return;
    for (int i = 0; i < a->n; i++)
        if (a->v[i] == s)
            return;
    a->v[a->n++] = s;
    json_t *ref = json_object_get(s, "$ref");
    if (json_is_string(ref))
        apply_add(root, a, resolve(root, json_string_value(ref)), depth + 1);
    static const char *const lists[] = {"allOf", "anyOf", "oneOf"};
    for (size_t l = 0; l < 3; l++) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(s, lists[l]), i, v) apply_add(root, a, v, depth + 1);
    }
}

/* ---- writing an instance ---- */

struct out {
    char *p;
    size_t n, cap;
    int unorderable;
};

static void put(struct out *o, const char *s)
{
    size_t n = strlen(s);
    if (o->n + n + 1 > o->cap) {
        o->cap = (o->n + n + 1) * 2;
        o->p = realloc(o->p, o->cap);
    }
    memcpy(o->p + o->n, s, n + 1);
    o->n += n;
}

/* The shortest %g that reads back, ".0" after an integral one (as jansson writes reals). */
static void put_real(struct out *o, double d)
{
    char buf[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, d);
        if (strtod(buf, NULL) == d)
            break;
    }
    if (!strpbrk(buf, ".eE"))
        strcat(buf, ".0");
    put(o, buf);
}

/* The position of key in the order the applying schemas list names, or -1. Sets *conflict
 * when two schemas order a and b differently (checked by the caller over pairs). */
static int key_rank(const struct apply *a, const char *key, int *rank_schema)
{
    int rank = 0;
    for (int i = 0; i < a->n; i++) {
        json_t *props = json_object_get(a->v[i], "properties");
        const char *k;
        json_t *v;
        json_object_foreach(props, k, v)
        {
            if (strcmp(k, key) == 0) {
                *rank_schema = i;
                return rank;
            }
            rank++;
        }
    }
    /* an object const / enum value is written in its own key order */
    for (int i = 0; i < a->n; i++) {
        json_t *vals[64];
        size_t nv = 0, j;
        json_t *v;
        if (json_is_object(json_object_get(a->v[i], "const")))
            vals[nv++] = json_object_get(a->v[i], "const");
        json_array_foreach(json_object_get(a->v[i], "enum"), j, v) if (nv < 64 &&
                                                                       json_is_object(v))
            vals[nv++] = v;
        for (size_t m = 0; m < nv; m++) {
            const char *k;
            json_t *x;
            int r = 0;
            json_object_foreach(vals[m], k, x)
            {
                if (strcmp(k, key) == 0) {
                    *rank_schema = i;
                    return rank + r;
                }
                r++;
            }
        }
    }
    for (int i = 0; i < a->n; i++) {
        size_t j;
        json_t *v;
        json_array_foreach(json_object_get(a->v[i], "required"), j, v)
        {
            if (json_is_string(v) && strcmp(json_string_value(v), key) == 0) {
                *rank_schema = i;
                return rank;
            }
            rank++;
        }
    }
    return -1;
}

/* Whether one applying schema lists x after y (so x-before-y cannot suit them all). */
static int listed_after(const struct apply *a, const char *x, const char *y)
{
    for (int i = 0; i < a->n; i++) {
        json_t *props = json_object_get(a->v[i], "properties");
        const char *k;
        json_t *v;
        int seen_y = 0;
        json_object_foreach(props, k, v)
        {
            if (strcmp(k, y) == 0)
                seen_y = 1;
            if (strcmp(k, x) == 0 && seen_y)
                return 1;
        }
    }
    return 0;
}

static void write_value(json_t *root, struct out *o, json_t *v, const struct apply *a);

static void child_apply(json_t *root, const struct apply *a, struct apply *c, const char *key,
                        size_t index, int is_key)
{
    c->n = 0;
    for (int i = 0; i < a->n; i++) {
        json_t *s = a->v[i], *sub = NULL;
        if (is_key) {
            sub = json_object_get(json_object_get(s, "properties"), key);
            if (!sub)
                sub = json_object_get(s, "additionalProperties");
        } else {
            json_t *pre = json_object_get(s, "prefixItems");
            sub = index < json_array_size(pre) ? json_array_get(pre, index)
                                               : json_object_get(s, "items");
        }
        apply_add(root, c, sub, 0);
    }
}

struct keyed {
    const char *key;
    json_t *val;
    int rank, order;
};

static int keyed_cmp(const void *x, const void *y)
{
    const struct keyed *a = x, *b = y;
    int ra = a->rank < 0 ? 1 << 30 : a->rank, rb = b->rank < 0 ? 1 << 30 : b->rank;
    return ra != rb ? (ra < rb ? -1 : 1) : (a->order < b->order ? -1 : a->order > b->order);
}

static void write_object(json_t *root, struct out *o, json_t *v, const struct apply *a)
{
    struct keyed keys[MAX_KEYS];
    int n = 0, schema;
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x)
    {
        if (n == MAX_KEYS)
            break;
        keys[n].key = k;
        keys[n].val = x;
        keys[n].rank = key_rank(a, k, &schema);
        keys[n].order = n;
        n++;
    }
    qsort(keys, (size_t)n, sizeof keys[0], keyed_cmp);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (keys[i].rank >= 0 && keys[j].rank >= 0 &&
                listed_after(a, keys[i].key, keys[j].key))
                o->unorderable = 1;
    put(o, "{");
    for (int i = 0; i < n; i++) {
        struct apply c;
        json_t *ks = json_string(keys[i].key);
        char *kt = json_dumps(ks, JSON_ENCODE_ANY);
        put(o, i ? "," : "");
        put(o, kt);
        put(o, ":");
        free(kt);
        json_decref(ks);
        child_apply(root, a, &c, keys[i].key, 0, 1);
        write_value(root, o, keys[i].val, &c);
    }
    put(o, "}");
}

static void write_value(json_t *root, struct out *o, json_t *v, const struct apply *a)
{
    char buf[64];
    size_t i;
    json_t *x;
    switch (json_typeof(v)) {
    case JSON_OBJECT: write_object(root, o, v, a); break;
    case JSON_ARRAY:
        put(o, "[");
        json_array_foreach(v, i, x)
        {
            struct apply c;
            put(o, i ? "," : "");
            child_apply(root, a, &c, NULL, i, 0);
            write_value(root, o, x, &c);
        }
        put(o, "]");
        break;
    case JSON_INTEGER:
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        put(o, buf);
        break;
    case JSON_REAL: put_real(o, json_real_value(v)); break;
    default: {
        char *t = json_dumps(v, JSON_ENCODE_ANY);
        put(o, t);
        free(t);
    }
    }
}

/* ---- the suite ---- */

struct totals {
    int groups, converted, refused, errors;
    int instances, checked, mismatches, unorderable, format_annotation, integral_float;
};

/* Whether v holds a real with an integral value (1.0): JSON Schema's integer, which the
 * grammar writes without a fraction (clients would read 1.0 as a float), so it refuses that
 * spelling; each such instance is printed and counted apart, never as a pass. */
static int has_integral_real(const json_t *v)
{
    size_t i;
    const char *k;
    json_t *x;
    if (json_is_real(v))
        return json_real_value(v) == floor(json_real_value(v));
    if (json_is_array(v))
        json_array_foreach(v, i, x) if (has_integral_real(x)) return 1;
    if (json_is_object(v))
        json_object_foreach((json_t *)v, k, x) if (has_integral_real(x)) return 1;
    return 0;
}

/* format is an annotation in draft 2020-12 (format.json says so); Kwker asserts the formats it
 * knows, as OpenAI's structured outputs do: strings those groups call valid may be refused. */
static int format_asserted(json_t *schema, json_t *data)
{
    json_t *f = json_is_object(schema) ? json_object_get(schema, "format") : NULL;
    return json_is_string(f) && json_is_string(data);
}

static void run_group(const char *file, json_t *g, struct totals *t, FILE *log)
{
    json_t *schema = json_object_get(g, "schema"), *tests = json_object_get(g, "tests");
    const char *desc = json_string_value(json_object_get(g, "description"));
    char *text = json_dumps(schema, JSON_ENCODE_ANY | JSON_COMPACT);
    struct kwk_err err = {0};
    size_t i;
    json_t *tc;
    t->groups++;
    kwk_grammar *gr = kwk_grammar_from_json_schema(text, strlen(text), &err);
    if (!gr) {
        if (err.code == KWK_EUNSUPPORTED) {
            t->refused++;
            fprintf(log, "  refused: %s: %s\n", desc, err.msg);
        } else {
            t->errors++;
            fprintf(stderr, "%s: %s: conversion failed (%d): %s\n  schema %s\n", file, desc,
                    err.code, err.msg, text);
        }
        free(text);
        return;
    }
    t->converted++;
    json_array_foreach(tests, i, tc)
    {
        json_t *data = json_object_get(tc, "data");
        int valid = json_is_true(json_object_get(tc, "valid"));
        struct apply a = {{0}, 0};
        struct out o = {0};
        t->instances++;
        apply_add(schema, &a, schema, 0);
        write_value(schema, &o, data, &a);
        if (o.unorderable) {
            t->unorderable++;
            fprintf(log, "  unorderable: %s: %s: %s\n", desc,
                    json_string_value(json_object_get(tc, "description")), o.p);
            free(o.p);
            continue;
        }
        int got = kwk_grammar_match(gr, o.p, o.n, NULL);
        t->checked++;
        if (got == 0 && valid && format_asserted(schema, data) &&
            strcmp(file, "format.json") == 0) {
            t->format_annotation++;
            fprintf(log, "  format asserted: %s: %s\n", desc, o.p);
        } else if (got == 0 && valid && has_integral_real(data)) {
            t->integral_float++;
            printf("  integral float refused (the grammar writes integers without a fraction): "
                   "%s: %s / %s: %s\n",
                   file, desc, json_string_value(json_object_get(tc, "description")), o.p);
        } else if (got != valid) {
            t->mismatches++;
            fprintf(stderr, "MISMATCH %s: %s / %s: %s expected %s, got %d\n  schema %s\n", file,
                    desc, json_string_value(json_object_get(tc, "description")), o.p,
                    valid ? "accept" : "reject", got, text);
        }
        free(o.p);
    }
    kwk_grammar_free(gr);
    free(text);
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void run_dir(const char *dir, struct totals *all)
{
    DIR *d = opendir(dir);
    char *names[256];
    int n = 0;
    struct dirent *e;
    if (!d)
        return;
    while ((e = readdir(d)) != NULL && n < 256) {
        size_t l = strlen(e->d_name);
        if (l > 5 && strcmp(e->d_name + l - 5, ".json") == 0)
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], name_cmp);
    FILE *log = getenv("KWK_SUITE_VERBOSE") ? stdout : fopen("/dev/null", "w");
    for (int i = 0; i < n; i++) {
        char path[1400];
        json_error_t je;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        json_t *groups = json_load_file(path, JSON_ALLOW_NUL, &je);
        struct totals t = {0};
        size_t k;
        json_t *g;
        if (!groups) {
            fprintf(stderr, "%s: %s\n", path, je.text);
            all->errors++;
            free(names[i]);
            continue;
        }
        json_array_foreach(groups, k, g) run_group(names[i], g, &t, log);
        printf("  %-28s groups %3d: converted %3d refused %3d errors %d; instances %3d "
               "checked %3d unorderable %d mismatches %d\n",
               names[i], t.groups, t.converted, t.refused, t.errors, t.instances, t.checked,
               t.unorderable, t.mismatches);
        all->groups += t.groups;
        all->converted += t.converted;
        all->refused += t.refused;
        all->errors += t.errors;
        all->instances += t.instances;
        all->checked += t.checked;
        all->mismatches += t.mismatches;
        all->unorderable += t.unorderable;
        all->format_annotation += t.format_annotation;
        all->integral_float += t.integral_float;
        json_decref(groups);
        free(names[i]);
    }
    if (log != stdout)
        fclose(log);
}

int main(void)
{
    const char *data = getenv("KWKER_SHARED_DATA");
    char dir[1100];
    struct totals all = {0};
    snprintf(dir, sizeof dir, "%.1000s/json-schema-test-suite/tests/draft2020-12",
             data && *data ? data : "../shared/data");
    run_dir(dir, &all);
    printf("suite: %d groups: %d converted, %d refused, %d errors; %d instances: %d checked, "
           "%d unorderable, %d format-asserted, %d integral floats refused, %d mismatches\n",
           all.groups, all.converted, all.refused, all.errors, all.instances, all.checked,
           all.unorderable, all.format_annotation, all.integral_float, all.mismatches);
    if (all.groups == 0)
        fprintf(stderr, "%s: no test files (set KWKER_SHARED_DATA to the shared data)\n", dir);
    T_TRUE(all.groups >= 380);
    T_EQ(all.errors, 0);
    T_EQ(all.mismatches, 0);
    /* the keywords a grammar can hold convert (the number reached when this was written) */
    T_TRUE(all.converted >= 135);
    return t_report("test_schema_suite");
}
