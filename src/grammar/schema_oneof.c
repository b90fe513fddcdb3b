/* schema_oneof.c - oneOf as a grammar: "exactly one branch" equals "at least one" when no
 * value can match two branches, which is shown here from the flattened branches (their types,
 * enums, string lengths, integer ranges, or a required property's const / enum values). One
 * conversion's thread. */
#include <errno.h>
#include <string.h>

#include "grammar/schema.h"

/* ---- oneOf: exact only when no value can match two branches ---- */

/* The types f can produce (its enum's, when it has one). */
static unsigned flat_types(const struct sflat *f)
{
    size_t i;
    json_t *v;
    unsigned t = 0;
    if (!f->enum_vals)
        return f->types;
    json_array_foreach(f->enum_vals, i, v) t |= schema_value_type(v) & f->types;
    return t;
}

static int enums_disjoint(const json_t *a, const json_t *b)
{
    size_t i, j;
    json_t *v, *w;
    json_array_foreach(a, i, v) json_array_foreach(b, j, w) if (json_schema_equal(v, w)) return 0;
    return 1;
}

/* The values a direct const / enum of schema s allows, or NULL. */
static json_t *direct_values(json_t *s, json_t **owned)
{
    json_t *c = json_is_object(s) ? json_object_get(s, "const") : NULL;
    *owned = NULL;
    if (c) {
        *owned = json_pack("[O]", c);
        return *owned;
    }
    json_t *e = json_is_object(s) ? json_object_get(s, "enum") : NULL;
    return json_is_array(e) ? e : NULL;
}

/* Objects told apart by a required property whose const / enum values differ (the
 * discriminator of tagged unions). */
static int objects_disjoint(const struct sflat *a, const struct sflat *b)
{
    size_t i;
    json_t *k;
    if (!a->required || !b->required || !a->props || !b->props)
        return 0;
    json_array_foreach(a->required, i, k)
    {
        const char *name = json_string_value(k);
        size_t j;
        json_t *kb;
        int in_b = 0;
        json_array_foreach(b->required, j, kb) in_b |= strcmp(json_string_value(kb), name) == 0;
        json_t *oa, *ob;
        json_t *va = direct_values(json_object_get(a->props, name), &oa);
        json_t *vb = direct_values(json_object_get(b->props, name), &ob);
        int apart = in_b && va && vb && enums_disjoint(va, vb);
        json_decref(oa);
        json_decref(ob);
        if (apart)
            return 1;
    }
    return 0;
}

static int flats_disjoint(const struct sflat *a, const struct sflat *b)
{
    unsigned both = flat_types(a) & flat_types(b);
    if (!both)
        return 1;
    if (a->enum_vals && b->enum_vals && enums_disjoint(a->enum_vals, b->enum_vals))
        return 1;
    if (a->enum_vals || b->enum_vals)
        return 0;
    /* every shared type must be told apart */
    if (both & (T_NULL | T_BOOL | T_ARRAY | T_NUMBER))
        return 0;
    if ((both & T_STRING) && !((a->max_len >= 0 && a->max_len < b->min_len) ||
                               (b->max_len >= 0 && b->max_len < a->min_len)))
        return 0;
    if ((both & T_INTEGER) &&
        !((a->has_hi && b->has_lo && (a->hi < b->lo || (a->hi == b->lo && (a->hi_excl ||
                                                                            b->lo_excl)))) ||
          (b->has_hi && a->has_lo && (b->hi < a->lo || (b->hi == a->lo && (b->hi_excl ||
                                                                            a->lo_excl))))))
        return 0;
    if ((both & T_OBJECT) && !objects_disjoint(a, b))
        return 0;
    return 1;
}

/* Refuses oneOf unless its branches (each flattened) are pairwise disjoint: then "exactly
 * one" is "at least one", which a grammar can hold. */
int schema_oneof_check(struct sconv *c, json_t *list, const char *ptr)
{
    size_t n = json_array_size(list);
    struct sflist *br = kwk_calloc(n ? n : 1, sizeof *br);
    int rc = 0;
    if (!br)
        return sconv_fail(c, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        char sub[SCHEMA_PTR_MAX];
        ptr_index(sub, ptr, "oneOf", i);
        rc = schema_flatten(c, json_array_get(list, i), sub, &br[i]);
    }
    for (size_t i = 0; i < n && !rc; i++)
        for (size_t j = i + 1; j < n && !rc; j++)
            for (size_t x = 0; x < br[i].n && !rc; x++)
                for (size_t y = 0; y < br[j].n && !rc; y++)
                    if (!flats_disjoint(br[i].v[x], br[j].v[y]))
                        rc = sconv_fail(c, KWK_EUNSUPPORTED,
                                        "json schema: \"oneOf\" at #%s: branches %zu and %zu "
                                        "may both match a value, and a grammar cannot hold "
                                        "\"exactly one\" (anyOf can be used)",
                                        ptr, i, j);
    for (size_t i = 0; i < n; i++)
        sflist_clear(&br[i]);
    kwk_free(br);
    return rc;
}
