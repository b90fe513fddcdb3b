/* schema_flat.c - flattening a schema into alternatives of simple keywords: keywords are
 * checked (refused when they constrain what a grammar cannot), $ref and allOf are merged,
 * anyOf and oneOf distributed. One conversion's thread. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "grammar/schema.h"

enum kw_action { KW_IGNORE, KW_HANDLED, KW_REFUSE };

struct keyword {
    const char *name;
    enum kw_action action;
    unsigned applies; /* the types it constrains (refused only when the schema allows one) */
};

/* Annotations and keywords without a constraint of their own are ignored, as are unknown
 * keywords (JSON Schema says so). */
static const struct keyword keywords[] = {
    {"type", KW_HANDLED, T_ALL},
    {"enum", KW_HANDLED, T_ALL},
    {"const", KW_HANDLED, T_ALL},
    {"properties", KW_HANDLED, T_OBJECT},
    {"required", KW_HANDLED, T_OBJECT},
    {"additionalProperties", KW_HANDLED, T_OBJECT},
    {"items", KW_HANDLED, T_ARRAY},
    {"prefixItems", KW_HANDLED, T_ARRAY},
    {"additionalItems", KW_HANDLED, T_ARRAY},
    {"minItems", KW_HANDLED, T_ARRAY},
    {"maxItems", KW_HANDLED, T_ARRAY},
    {"minLength", KW_HANDLED, T_STRING},
    {"maxLength", KW_HANDLED, T_STRING},
    {"pattern", KW_HANDLED, T_STRING},
    {"format", KW_HANDLED, T_STRING},
    {"minimum", KW_HANDLED, T_INTEGER | T_NUMBER},
    {"maximum", KW_HANDLED, T_INTEGER | T_NUMBER},
    {"exclusiveMinimum", KW_HANDLED, T_INTEGER | T_NUMBER},
    {"exclusiveMaximum", KW_HANDLED, T_INTEGER | T_NUMBER},
    {"anyOf", KW_HANDLED, T_ALL},
    {"oneOf", KW_HANDLED, T_ALL},
    {"allOf", KW_HANDLED, T_ALL},
    {"$ref", KW_HANDLED, T_ALL},
    {"$id", KW_HANDLED, T_ALL},
    {"multipleOf", KW_REFUSE, T_INTEGER | T_NUMBER},
    {"uniqueItems", KW_REFUSE, T_ARRAY},
    {"contains", KW_REFUSE, T_ARRAY},
    {"unevaluatedItems", KW_REFUSE, T_ARRAY},
    {"patternProperties", KW_REFUSE, T_OBJECT},
    {"propertyNames", KW_REFUSE, T_OBJECT},
    {"minProperties", KW_REFUSE, T_OBJECT},
    {"maxProperties", KW_REFUSE, T_OBJECT},
    {"dependentRequired", KW_REFUSE, T_OBJECT},
    {"dependentSchemas", KW_REFUSE, T_OBJECT},
    {"dependencies", KW_REFUSE, T_OBJECT}, /* draft 7's: whoever writes it means it */
    {"unevaluatedProperties", KW_REFUSE, T_OBJECT},
    {"not", KW_REFUSE, T_ALL},
    {"if", KW_REFUSE, T_ALL},
    {"$dynamicRef", KW_REFUSE, T_ALL},
    {"$recursiveRef", KW_REFUSE, T_ALL},
};

static const struct keyword *keyword_find(const char *k)
{
    for (size_t i = 0; i < KWK_ARRAY_LEN(keywords); i++)
        if (strcmp(keywords[i].name, k) == 0)
            return &keywords[i];
    return NULL;
}

/* ---- flat schemas ---- */

struct sflat *sflat_new(const char *ptr)
{
    struct sflat *f = kwk_calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->types = T_ALL;
    f->max_items = -1;
    f->max_len = -1;
    snprintf(f->ptr, sizeof f->ptr, "%s", ptr);
    return f;
}

void sflat_free(struct sflat *f)
{
    if (!f)
        return;
    json_decref(f->enum_vals);
    json_decref(f->props);
    json_decref(f->required);
    json_decref(f->addl);
    json_decref(f->prefix);
    json_decref(f->items);
    json_decref(f->whole);
    kwk_free(f);
}

void sflist_clear(struct sflist *l)
{
    for (size_t i = 0; i < l->n; i++)
        sflat_free(l->v[i]);
    kwk_free(l->v);
    memset(l, 0, sizeof *l);
}

static int sflist_push(struct sconv *c, struct sflist *l, struct sflat *f)
{
    if (!f)
        return sconv_fail(c, -ENOMEM, "out of memory");
    if (l->n >= SCHEMA_ALTS_MAX) {
        sflat_free(f);
        return sconv_fail(c, KWK_ELIMIT,
                          "json schema: more than %d alternatives (anyOf / oneOf inside allOf "
                          "multiply)",
                          SCHEMA_ALTS_MAX);
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        struct sflat **v = kwk_realloc(l->v, cap * sizeof *v);
        if (!v) {
            sflat_free(f);
            return sconv_fail(c, -ENOMEM, "out of memory");
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = f;
    return 0;
}

/* ---- equality and numbers ---- */

int json_is_integral(const json_t *v)
{
    if (json_is_integer(v))
        return 1;
    if (!json_is_real(v))
        return 0;
    double d = json_real_value(v);
    return isfinite(d) && d == floor(d);
}

static long double num_value(const json_t *v)
{
    return json_is_integer(v) ? (long double)json_integer_value(v)
                              : (long double)json_real_value(v);
}

int json_schema_equal(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b))
        return num_value(a) == num_value(b);
    if (json_typeof(a) != json_typeof(b))
        return 0;
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b))
            return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!json_schema_equal(json_array_get(a, i), json_array_get(b, i)))
                return 0;
        return 1;
    }
    if (json_is_object(a)) {
        const char *k;
        json_t *v;
        if (json_object_size(a) != json_object_size(b))
            return 0;
        json_object_foreach((json_t *)a, k, v)
        {
            json_t *w = json_object_get(b, k);
            if (!w || !json_schema_equal(v, w))
                return 0;
        }
        return 1;
    }
    return json_equal((json_t *)a, (json_t *)b);
}

/* ---- reading one schema's own keywords ---- */

static int bad_value(struct sconv *c, const char *ptr, const char *kw, const char *want)
{
    return sconv_fail(c, KWK_EFORMAT, "json schema: \"%s\" at #%s must be %s", kw, ptr, want);
}

static int type_bits(const char *t)
{
    static const struct {
        const char *name;
        unsigned bits;
    } types[] = {{"null", T_NULL},       {"boolean", T_BOOL},    {"object", T_OBJECT},
                 {"array", T_ARRAY},     {"string", T_STRING},   {"integer", T_INTEGER},
                 {"number", T_INTEGER | T_NUMBER}};
    for (size_t i = 0; i < KWK_ARRAY_LEN(types); i++)
        if (strcmp(t, types[i].name) == 0)
            return (int)types[i].bits;
    return -1;
}

static int read_types(struct sconv *c, json_t *t, const char *ptr, unsigned *out)
{
    unsigned bits = 0;
    size_t i;
    json_t *v;
    if (json_is_string(t)) {
        int b = type_bits(json_string_value(t));
        if (b < 0)
            return bad_value(c, ptr, "type", "a JSON Schema type name");
        *out = (unsigned)b;
        return 0;
    }
    if (!json_is_array(t))
        return bad_value(c, ptr, "type", "a type name or a list of them");
    json_array_foreach(t, i, v)
    {
        int b = json_is_string(v) ? type_bits(json_string_value(v)) : -1;
        if (b < 0)
            return bad_value(c, ptr, "type", "a list of JSON Schema type names");
        bits |= (unsigned)b;
    }
    *out = bits;
    return 0;
}

static int read_count(struct sconv *c, json_t *v, const char *ptr, const char *kw, int64_t *out)
{
    if (!json_is_integral(v) || num_value(v) < 0)
        return bad_value(c, ptr, kw, "a non-negative integer");
    long double d = num_value(v);
    *out = d > (long double)INT64_MAX / 2 ? INT64_MAX / 2 : (int64_t)d;
    return 0;
}

static int is_schema(const json_t *v)
{
    return json_is_object(v) || json_is_boolean(v);
}

/* Whether the keyword k constrains a schema whose own "type" allows local_types. */
static int applies(const struct keyword *kw, unsigned local_types, const json_t *val)
{
    if (!(kw->applies & local_types))
        return 0;
    /* the values that constrain nothing */
    if (strcmp(kw->name, "uniqueItems") == 0 && json_is_false(val))
        return 0;
    if (strcmp(kw->name, "minProperties") == 0 && json_is_integral(val) &&
        num_value(val) <= 0)
        return 0;
    return 1;
}

static int check_keywords(struct sconv *c, json_t *s, const char *ptr, unsigned local_types,
                          int is_root)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v)
    {
        const struct keyword *kw = keyword_find(k);
        if (!kw || kw->action == KW_IGNORE)
            continue;
        if (kw->action == KW_REFUSE && applies(kw, local_types, v))
            return sconv_fail(c, KWK_EUNSUPPORTED,
                              "json schema: \"%s\" at #%s cannot be enforced by a grammar", k,
                              ptr);
        /* An embedded resource moves the base of the references under it; only the root
         * may name itself when references are used. */
        if (strcmp(k, "$id") == 0 && !is_root && c->has_ref)
            return sconv_fail(c, KWK_EUNSUPPORTED,
                              "json schema: \"$id\" at #%s: references inside embedded "
                              "resources are not supported",
                              ptr);
    }
    return 0;
}

static int read_bound(struct sconv *c, struct sflat *f, json_t *s, const char *ptr)
{
    static const char *const names[] = {"minimum", "exclusiveMinimum", "maximum",
                                         "exclusiveMaximum"};
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(s, names[i]);
        if (!v)
            continue;
        if (!json_is_number(v))
            return bad_value(c, ptr, names[i], "a number");
        long double d = num_value(v);
        int excl = i == 1 || i == 3;
        if (i < 2 && (!f->has_lo || d > f->lo || (d == f->lo && excl))) {
            f->has_lo = 1;
            f->lo = d;
            f->lo_excl = excl;
        } else if (i >= 2 && (!f->has_hi || d < f->hi || (d == f->hi && excl))) {
            f->has_hi = 1;
            f->hi = d;
            f->hi_excl = excl;
        }
        ptr_child(f->bound_ptr, ptr, names[i]);
    }
    return 0;
}

static int read_enum(struct sconv *c, struct sflat *f, json_t *s, const char *ptr)
{
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en && !json_is_array(en))
        return bad_value(c, ptr, "enum", "a list");
    if (cn) {
        f->enum_vals = json_array();
        if (!f->enum_vals || json_array_append(f->enum_vals, cn))
            return sconv_fail(c, -ENOMEM, "out of memory");
        /* const and enum: the const when enum has it, else nothing */
        if (en) {
            size_t i;
            json_t *v;
            int found = 0;
            json_array_foreach(en, i, v) found |= json_schema_equal(v, cn);
            if (!found)
                json_array_clear(f->enum_vals);
        }
    } else if (en) {
        f->enum_vals = json_incref(en);
    }
    return 0;
}

/* A name or pattern with a NUL inside: C strings would cut it short, so it is refused. */
static int nul_inside(struct sconv *c, const char *ptr, const char *kw, size_t len,
                      const char *s)
{
    if (strlen(s) == len)
        return 0;
    return sconv_fail(c, KWK_EUNSUPPORTED,
                      "json schema: \"%s\" at #%s: a NUL character inside is not supported", kw,
                      ptr);
}

static int read_object_kws(struct sconv *c, struct sflat *f, json_t *s, const char *ptr)
{
    json_t *p = json_object_get(s, "properties"), *r = json_object_get(s, "required");
    json_t *a = json_object_get(s, "additionalProperties");
    size_t i;
    json_t *v;
    if (p && !json_is_object(p))
        return bad_value(c, ptr, "properties", "an object");
    if (p) {
        const char *k;
        json_object_foreach(p, k, v)
        {
            if (!is_schema(v))
                return bad_value(c, ptr, "properties", "an object of schemas");
            size_t kl = json_object_iter_key_len(json_object_key_to_iter(k));
            if (nul_inside(c, ptr, "properties", kl, k))
                return c->rc;
        }
    }
    if (r && !json_is_array(r))
        return bad_value(c, ptr, "required", "a list of names");
    if (r) {
        json_array_foreach(r, i, v)
        {
            if (!json_is_string(v))
                return bad_value(c, ptr, "required", "a list of names");
            if (nul_inside(c, ptr, "required", json_string_length(v), json_string_value(v)))
                return c->rc;
        }
    }
    if (a && !is_schema(a))
        return bad_value(c, ptr, "additionalProperties", "a schema");
    f->props = json_incref(p);
    f->required = json_incref(r);
    f->addl = json_is_true(a) ? NULL : json_incref(a);
    return 0;
}

static int read_array_kws(struct sconv *c, struct sflat *f, json_t *s, const char *ptr)
{
    json_t *pre = json_object_get(s, "prefixItems"), *it = json_object_get(s, "items");
    json_t *more = json_object_get(s, "additionalItems");
    json_t *v;
    size_t i;
    if (json_is_array(it) && !pre) {
        /* draft 7's tuple form, still common: items [...] with additionalItems */
        pre = it;
        it = more;
    }
    if (pre && !json_is_array(pre))
        return bad_value(c, ptr, "prefixItems", "a list of schemas");
    if (pre)
        json_array_foreach(pre, i, v) if (!is_schema(v)) return bad_value(
            c, ptr, "prefixItems", "a list of schemas");
    if (it && !is_schema(it))
        return bad_value(c, ptr, "items", "a schema");
    f->prefix = json_incref(pre);
    f->items = json_is_true(it) ? NULL : json_incref(it);
    if ((v = json_object_get(s, "minItems")) && read_count(c, v, ptr, "minItems", &f->min_items))
        return c->rc;
    if ((v = json_object_get(s, "maxItems")) && read_count(c, v, ptr, "maxItems", &f->max_items))
        return c->rc;
    return 0;
}

static int read_string_kws(struct sconv *c, struct sflat *f, json_t *s, const char *ptr)
{
    json_t *v;
    if ((v = json_object_get(s, "minLength")) && read_count(c, v, ptr, "minLength", &f->min_len))
        return c->rc;
    if ((v = json_object_get(s, "maxLength")) && read_count(c, v, ptr, "maxLength", &f->max_len))
        return c->rc;
    if ((v = json_object_get(s, "pattern"))) {
        if (!json_is_string(v))
            return bad_value(c, ptr, "pattern", "a string");
        if (nul_inside(c, ptr, "pattern", json_string_length(v), json_string_value(v)))
            return c->rc;
        f->pattern = json_string_value(v);
        ptr_child(f->pattern_ptr, ptr, "pattern");
    }
    if ((v = json_object_get(s, "format"))) {
        if (!json_is_string(v))
            return bad_value(c, ptr, "format", "a string");
        f->format = json_string_value(v);
    }
    return 0;
}

static struct sflat *flat_from_local(struct sconv *c, json_t *s, const char *ptr)
{
    struct sflat *f = sflat_new(ptr);
    json_t *t = json_object_get(s, "type");
    if (!f) {
        sconv_fail(c, -ENOMEM, "out of memory");
        return NULL;
    }
    if ((t && read_types(c, t, ptr, &f->types)) || read_enum(c, f, s, ptr) ||
        read_object_kws(c, f, s, ptr) || read_array_kws(c, f, s, ptr) ||
        read_string_kws(c, f, s, ptr) || read_bound(c, f, s, ptr)) {
        sflat_free(f);
        return NULL;
    }
    return f;
}

/* ---- merging (allOf) ---- */

/* allOf [a, b] as a schema (NULL stands for `true`); a new reference. */
static json_t *schema_and(const json_t *a, const json_t *b)
{
    if (!a || json_is_true(a))
        return b ? json_incref((json_t *)b) : json_true();
    if (!b || json_is_true(b))
        return json_incref((json_t *)a);
    if (json_is_false(a) || json_is_false(b))
        return json_false();
    if (json_schema_equal(a, b))
        return json_incref((json_t *)a);
    return json_pack("{s:[OO]}", "allOf", a, b);
}

static json_t *prop_or_addl(const struct sflat *f, const char *k)
{
    json_t *p = f->props ? json_object_get(f->props, k) : NULL;
    return p ? p : f->addl;
}

static int merge_objects(struct sflat *m, const struct sflat *a, const struct sflat *b)
{
    const char *k;
    json_t *v;
    size_t i;
    if (a->props || b->props) {
        /* a key is checked by each side's property schema, or its additionalProperties */
        m->props = json_object();
        if (!m->props)
            return -ENOMEM;
        for (int side = 0; side < 2; side++) {
            json_t *p = side ? b->props : a->props;
            if (!p)
                continue;
            json_object_foreach(p, k, v)
            {
                if (json_object_get(m->props, k))
                    continue;
                if (json_object_set_new(m->props, k,
                                        schema_and(prop_or_addl(a, k), prop_or_addl(b, k))))
                    return -ENOMEM;
            }
        }
    }
    if (a->required || b->required) {
        m->required = json_array();
        if (!m->required)
            return -ENOMEM;
        for (int side = 0; side < 2; side++) {
            json_t *r = side ? b->required : a->required;
            if (!r)
                continue;
            json_array_foreach(r, i, v)
            {
                size_t j;
                json_t *w;
                int seen = 0;
                json_array_foreach(m->required, j, w) seen |= json_equal(v, w);
                if (!seen && json_array_append(m->required, v))
                    return -ENOMEM;
            }
        }
    }
    m->addl = (a->addl || b->addl) ? schema_and(a->addl, b->addl) : NULL;
    return 0;
}

static json_t *item_at(const struct sflat *f, size_t i)
{
    if (f->prefix && i < json_array_size(f->prefix))
        return json_array_get(f->prefix, i);
    return f->items;
}

static int merge_arrays(struct sflat *m, const struct sflat *a, const struct sflat *b)
{
    size_t na = a->prefix ? json_array_size(a->prefix) : 0;
    size_t nb = b->prefix ? json_array_size(b->prefix) : 0;
    size_t n = na > nb ? na : nb;
    if (n) {
        m->prefix = json_array();
        if (!m->prefix)
            return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
            json_t *it = schema_and(item_at(a, i), item_at(b, i));
            if (!it || json_array_append_new(m->prefix, it))
                return -ENOMEM;
        }
    }
    m->items = (a->items || b->items) ? schema_and(a->items, b->items) : NULL;
    m->min_items = KWK_MAX(a->min_items, b->min_items);
    m->max_items = a->max_items < 0   ? b->max_items
                   : b->max_items < 0 ? a->max_items
                                      : KWK_MIN(a->max_items, b->max_items);
    return 0;
}

static int merge_enums(struct sflat *m, const struct sflat *a, const struct sflat *b)
{
    size_t i;
    json_t *v;
    if (!a->enum_vals || !b->enum_vals) {
        m->enum_vals = json_incref(a->enum_vals ? a->enum_vals : b->enum_vals);
        return 0;
    }
    m->enum_vals = json_array();
    if (!m->enum_vals)
        return -ENOMEM;
    json_array_foreach(a->enum_vals, i, v)
    {
        size_t j;
        json_t *w;
        int in_b = 0;
        json_array_foreach(b->enum_vals, j, w) in_b |= json_schema_equal(v, w);
        if (in_b && json_array_append(m->enum_vals, v))
            return -ENOMEM;
    }
    return 0;
}

static void merge_bounds(struct sflat *m, const struct sflat *a, const struct sflat *b)
{
    const struct sflat *s[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        if (s[i]->has_lo && (!m->has_lo || s[i]->lo > m->lo ||
                             (s[i]->lo == m->lo && s[i]->lo_excl))) {
            m->has_lo = 1;
            m->lo = s[i]->lo;
            m->lo_excl = s[i]->lo_excl;
        }
        if (s[i]->has_hi && (!m->has_hi || s[i]->hi < m->hi ||
                             (s[i]->hi == m->hi && s[i]->hi_excl))) {
            m->has_hi = 1;
            m->hi = s[i]->hi;
            m->hi_excl = s[i]->hi_excl;
        }
        if (s[i]->has_lo || s[i]->has_hi)
            memcpy(m->bound_ptr, s[i]->bound_ptr, sizeof m->bound_ptr);
    }
}

/* Both a and b: exact for every keyword a flat schema holds, refused for two patterns or two
 * formats (a grammar cannot intersect regular expressions here). */
static struct sflat *sflat_merge(struct sconv *c, const struct sflat *a, const struct sflat *b)
{
    struct sflat *m = sflat_new(a->ptr);
    int rc = 0;
    if (!m) {
        sconv_fail(c, -ENOMEM, "out of memory");
        return NULL;
    }
    m->types = a->types & b->types;
    if (merge_enums(m, a, b) || merge_objects(m, a, b) || merge_arrays(m, a, b))
        rc = sconv_fail(c, -ENOMEM, "out of memory");
    m->min_len = KWK_MAX(a->min_len, b->min_len);
    m->max_len = a->max_len < 0   ? b->max_len
                 : b->max_len < 0 ? a->max_len
                                  : KWK_MIN(a->max_len, b->max_len);
    merge_bounds(m, a, b);
    if (!rc && a->pattern && b->pattern && strcmp(a->pattern, b->pattern) != 0)
        rc = sconv_fail(c, KWK_EUNSUPPORTED,
                        "json schema: \"pattern\" at #%s together with the one at #%s (allOf): "
                        "two patterns cannot be intersected",
                        b->pattern_ptr, a->pattern_ptr);
    m->pattern = a->pattern ? a->pattern : b->pattern;
    memcpy(m->pattern_ptr, a->pattern ? a->pattern_ptr : b->pattern_ptr, sizeof m->pattern_ptr);
    if (!rc && a->format && b->format && strcmp(a->format, b->format) != 0)
        rc = sconv_fail(c, KWK_EUNSUPPORTED,
                        "json schema: \"format\" at #%s: two formats (allOf) cannot be "
                        "intersected",
                        b->ptr);
    m->format = a->format ? a->format : b->format;
    if (rc) {
        sflat_free(m);
        return NULL;
    }
    return m;
}

/* alts = alts x more (each pair merged); more is consumed. */
static int cross(struct sconv *c, struct sflist *alts, struct sflist *more)
{
    struct sflist out = {0};
    int rc = 0;
    if (alts->n * more->n > SCHEMA_ALTS_MAX)
        rc = sconv_fail(c, KWK_ELIMIT,
                        "json schema: more than %d alternatives (anyOf / oneOf / allOf "
                        "multiply)",
                        SCHEMA_ALTS_MAX);
    for (size_t i = 0; i < alts->n && !rc; i++)
        for (size_t j = 0; j < more->n && !rc; j++)
            rc = sflist_push(c, &out, sflat_merge(c, alts->v[i], more->v[j]));
    sflist_clear(alts);
    sflist_clear(more);
    if (rc) {
        sflist_clear(&out);
        return rc;
    }
    *alts = out;
    return 0;
}

/* ---- $ref ---- */

/* A JSON pointer fragment ("#", "#/$defs/a~1b", percent-encoded) into the document. */
static json_t *ref_resolve(struct sconv *c, const char *ref, const char *ptr)
{
    json_t *cur = c->root;
    const char *p;
    if (ref[0] != '#') {
        json_t *id = json_is_object(c->root) ? json_object_get(c->root, "$id") : NULL;
        size_t n = id && json_is_string(id) ? strlen(json_string_value(id)) : 0;
        /* the root's own URI followed by a fragment names the root too */
        if (!n || strncmp(ref, json_string_value(id), n) != 0 ||
            (ref[n] != '#' && ref[n] != 0)) {
            sconv_fail(c, KWK_EUNSUPPORTED,
                       "json schema: \"$ref\" at #%s: \"%.80s\" is not in this document (only "
                       "\"#...\" pointers are followed)",
                       ptr, ref);
            return NULL;
        }
        ref += n;
        if (!*ref)
            return cur;
    }
    p = ref + 1;
    if (*p && *p != '/') {
        sconv_fail(c, KWK_EUNSUPPORTED,
                   "json schema: \"$ref\" at #%s: anchors (\"%.80s\") are not supported", ptr,
                   ref);
        return NULL;
    }
    while (*p == '/') {
        char tok[256];
        size_t n = 0;
        for (p++; *p && *p != '/' && n + 1 < sizeof tok; p++) {
            char ch = *p;
            if (ch == '~' && (p[1] == '0' || p[1] == '1')) {
                ch = p[1] == '0' ? '~' : '/';
                p++;
            } else if (ch == '%' && p[1] && p[2]) {
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
        if (json_is_object(cur)) {
            cur = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end;
            unsigned long i = strtoul(tok, &end, 10);
            cur = (*tok && !*end) ? json_array_get(cur, i) : NULL;
        } else {
            cur = NULL;
        }
        if (!cur)
            break;
    }
    if (!cur || !is_schema(cur)) {
        sconv_fail(c, KWK_EFORMAT, "json schema: \"$ref\" at #%s: \"%.80s\" names no schema",
                   ptr, ref);
        return NULL;
    }
    return cur;
}

static int flatten_ref(struct sconv *c, json_t *s, const char *ptr, struct sflist *alts)
{
    json_t *ref = json_object_get(s, "$ref");
    char rptr[SCHEMA_PTR_MAX];
    struct sflist more = {0};
    if (!json_is_string(ref))
        return bad_value(c, ptr, "$ref", "a string");
    json_t *target = ref_resolve(c, json_string_value(ref), ptr);
    if (!target)
        return c->rc;
    for (int i = c->inline_base; i < c->n_inlining; i++)
        if (c->inlining[i] == target)
            return sconv_fail(c, KWK_EUNSUPPORTED,
                              "json schema: \"$ref\" at #%s refers back to itself before any "
                              "property or item: no finite value could match",
                              ptr);
    if (c->n_inlining >= SCHEMA_DEPTH_MAX)
        return sconv_fail(c, KWK_ELIMIT, "json schema: \"$ref\" at #%s: nested deeper than %d",
                          ptr, SCHEMA_DEPTH_MAX);
    c->inlining[c->n_inlining++] = target;
    ptr_child(rptr, ptr, "$ref");
    int rc = schema_flatten(c, target, rptr, &more);
    c->n_inlining--;
    return rc ? rc : cross(c, alts, &more);
}

/* Whether f constrains nothing (as the schema `true`). */
static int flat_trivial(const struct sflat *f)
{
    return f->types == T_ALL && !f->enum_vals && !f->props && !f->required && !f->addl &&
           !f->prefix && !f->items && f->min_items == 0 && f->max_items < 0 &&
           f->min_len == 0 && f->max_len < 0 && !f->pattern && !f->format && !f->has_lo &&
           !f->has_hi && !f->whole;
}

static int flatten_list(struct sconv *c, json_t *s, const char *ptr, const char *kw,
                        struct sflist *alts)
{
    json_t *list = json_object_get(s, kw);
    size_t i;
    json_t *v;
    int rc = 0;
    if (!json_is_array(list) || json_array_size(list) == 0)
        return bad_value(c, ptr, kw, "a non-empty list of schemas");
    if (strcmp(kw, "allOf") == 0) {
        json_array_foreach(list, i, v)
        {
            char sub[SCHEMA_PTR_MAX];
            struct sflist more = {0};
            ptr_index(sub, ptr, kw, i);
            if ((rc = schema_flatten(c, v, sub, &more)) || (rc = cross(c, alts, &more))) {
                sflist_clear(&more);
                return rc;
            }
        }
        return 0;
    }
    /* anyOf; oneOf when no value can match two of its branches */
    struct sflist any = {0};
    if (strcmp(kw, "oneOf") == 0 && (rc = schema_oneof_check(c, list, ptr)))
        return rc;
    /* Where nothing else constrains the value, a $ref branch stays a rule of its own. */
    int keep_refs = c->depth == c->flat_top && alts->n == 1 && flat_trivial(alts->v[0]) &&
                    !(strcmp(kw, "anyOf") == 0 && json_object_get(s, "oneOf"));
    json_array_foreach(list, i, v)
    {
        char sub[SCHEMA_PTR_MAX], name[8];
        ptr_index(sub, ptr, kw, i);
        if (keep_refs && json_is_object(v) && schema_pure_ref(v, name, sizeof name)) {
            struct sflat *f = sflat_new(sub);
            if (f)
                f->whole = json_incref(v);
            rc = sflist_push(c, &any, f);
        } else {
            rc = schema_flatten(c, v, sub, &any);
        }
        if (rc) {
            sflist_clear(&any);
            return rc;
        }
    }
    if (keep_refs) {
        sflist_clear(alts);
        *alts = any;
        return 0;
    }
    return cross(c, alts, &any);
}

int schema_flatten(struct sconv *c, json_t *s, const char *ptr, struct sflist *out)
{
    struct sflist alts = {0};
    unsigned local_types = T_ALL;
    int rc = 0;
    if (c->rc)
        return c->rc;
    if (sconv_step(c))
        return c->rc;
    if (++c->depth > SCHEMA_FLAT_MAX) {
        rc = sconv_fail(c, KWK_ELIMIT, "json schema at #%s: nested deeper than %d", ptr,
                        SCHEMA_FLAT_MAX);
        goto out;
    }
    if (json_is_true(s)) {
        rc = sflist_push(c, out, sflat_new(ptr));
        goto out;
    }
    if (json_is_false(s))
        goto out;
    if (!json_is_object(s)) {
        rc = sconv_fail(c, KWK_EFORMAT, "json schema at #%s: a schema is an object or a boolean",
                        ptr);
        goto out;
    }
    json_t *t = json_object_get(s, "type");
    if (t && (rc = read_types(c, t, ptr, &local_types)))
        goto out;
    if ((rc = check_keywords(c, s, ptr, local_types, s == c->root)))
        goto out;
    if ((rc = sflist_push(c, &alts, flat_from_local(c, s, ptr))))
        goto out;
    if (json_object_get(s, "$ref") && (rc = flatten_ref(c, s, ptr, &alts)))
        goto out;
    static const char *const lists[] = {"allOf", "anyOf", "oneOf"};
    for (size_t i = 0; i < KWK_ARRAY_LEN(lists); i++)
        if (json_object_get(s, lists[i]) && (rc = flatten_list(c, s, ptr, lists[i], &alts)))
            goto out;
    for (size_t i = 0; i < alts.n && !rc; i++) {
        rc = sflist_push(c, out, alts.v[i]);
        alts.v[i] = NULL;
    }
out:
    sflist_clear(&alts);
    c->depth--;
    return rc ? rc : c->rc;
}
