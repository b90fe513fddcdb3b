/* schema.h - the JSON Schema to GBNF converter's internal contract (schema*.c): the text
 * buffer, the rule table, flattened schemas and the generators. One conversion is one
 * struct sconv on one thread; nothing here is shared between conversions.
 *
 * The converter in brief: a schema is *flattened* into alternatives (struct sflat) that hold
 * only simple keywords, $ref / allOf / anyOf / oneOf being merged or distributed away; each
 * alternative is then *generated* per JSON type it allows (null, boolean, number, string,
 * array, object), the subschemas of properties and items being *visited* as rules of their own
 * (cached by content, so recursive schemas become recursive rules). */
#ifndef KWK_GRAMMAR_SCHEMA_H
#define KWK_GRAMMAR_SCHEMA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#define SCHEMA_DEPTH_MAX 64      /* nesting of values (properties, items) in the schema */
#define SCHEMA_FLAT_MAX 128      /* nesting of allOf / anyOf / $ref expansions */
#define SCHEMA_ALTS_MAX 256      /* alternatives of one schema after distributing anyOf */
#define SCHEMA_STEPS_MAX 200000  /* flatten / visit calls and rule names tried in a conversion */
#define SCHEMA_DUMP_MAX (64 << 20) /* bytes of subschema text compared in one conversion */
#define SCHEMA_PTR_MAX 192       /* bytes of a JSON pointer kept for messages */
#define SCHEMA_NAME_MAX 96       /* bytes of a rule name derived from a path */
#define SCHEMA_CLASS_MAX 256     /* ranges of one character class of a pattern */
#define SCHEMA_ENUM_NEST 64      /* groups nested in one rule of an enum's prefix tree */

/* Growable NUL-terminated text with a sticky error (0, -ENOMEM or KWK_ELIMIT past
 * KWK_GRAMMAR_TEXT_MAX bytes) checked once by whoever takes the text. */
struct sbuf {
    char *p;
    size_t n, cap;
    int err;
};
void sb_put(struct sbuf *b, const char *s, size_t n);
void sb_puts(struct sbuf *b, const char *s);
void sb_printf(struct sbuf *b, const char *fmt, ...) KWK_PRINTF(2, 3);
/* The text (caller frees with kwk_free), or NULL with *rc set when the buffer failed. */
char *sb_take(struct sbuf *b, int *rc);
void sb_free(struct sbuf *b);
/* A GBNF string literal for bytes s[n]: "..." with \" \\ \n \r \t and \xHH for controls. */
void sb_literal(struct sbuf *b, const char *s, size_t n);

/* JSON types as bits. T_NUMBER stands for the numbers that are not integers, so the keyword
 * "number" is T_INTEGER | T_NUMBER and intersections are plain ANDs. */
enum {
    T_NULL = 1,
    T_BOOL = 2,
    T_OBJECT = 4,
    T_ARRAY = 8,
    T_STRING = 16,
    T_INTEGER = 32,
    T_NUMBER = 64,
    T_ALL = 127,
};

/* The T_* bit of a JSON value (an integral number is T_INTEGER, as JSON Schema counts 1.0). */
unsigned schema_value_type(const json_t *v);

/* One alternative of a schema, with only simple keywords left. json_t fields hold references
 * (NULL: absent; for schemas, absent means `true`). */
struct sflat {
    unsigned types;
    json_t *enum_vals;   /* array: the values allowed (const and enum), or NULL */
    json_t *props;       /* object: name -> schema, in the schema's order */
    json_t *required;    /* array of names */
    json_t *addl;        /* additionalProperties */
    json_t *prefix;      /* array: prefixItems */
    json_t *items;       /* items (for positions past prefix) */
    int64_t min_items, max_items; /* max -1: none */
    int64_t min_len, max_len;     /* max -1: none */
    const char *pattern;          /* borrowed from the document */
    const char *format;           /* borrowed from the document */
    int has_lo, lo_excl, has_hi, hi_excl;
    long double lo, hi;           /* minimum / maximum (exact for 64-bit integers) */
    char ptr[SCHEMA_PTR_MAX];     /* where the schema (its first part) was found */
    char bound_ptr[SCHEMA_PTR_MAX]; /* where a bound was found, for messages */
    char pattern_ptr[SCHEMA_PTR_MAX];
    json_t *whole; /* instead of all the above: the rule of this subschema (a $ref branch of
                    * anyOf, kept a rule of its own so that recursion closes at once) */
};

struct sflist {
    struct sflat **v;
    size_t n, cap;
};

struct srule {
    char *name;
    char *body;  /* NULL while pending (a recursive reference may name it already) */
    int dead;    /* dropped: its schema allows nothing */
};

/* A small open-addressed map from strings to indexes. */
struct smap {
    char **keys;
    size_t *vals;
    size_t cap, n;
};

struct scache_entry {
    char *rule; /* rule name, or NULL when the schema allows nothing */
};

struct sconv {
    json_t *root;
    struct kwk_err *err;
    int rc; /* sticky: the first failure */
    struct srule *rules;
    size_t n_rules, cap_rules;
    struct smap rule_index;  /* name -> rules[] */
    struct scache_entry *cache;
    size_t n_cache, cap_cache;
    struct smap cache_index; /* schema text -> cache[] */
    const json_t *inlining[SCHEMA_DEPTH_MAX]; /* $ref targets being expanded by flatten */
    int n_inlining, inline_base;
    int flat_top; /* the depth of the flatten that a visit called (its anyOf may keep refs) */
    int depth;       /* of schema_flatten calls */
    int visit_depth; /* of schema_visit calls */
    long steps;
    size_t dumped;   /* bytes of subschemas written out as cache keys */
    int has_ref;
    size_t text_size; /* bytes of rule bodies so far */
};

/* schema.c */
int sconv_fail(struct sconv *c, int code, const char *fmt, ...) KWK_PRINTF(3, 4);
/* Count one unit of conversion work (a flatten or visit call, a rule name tried): 0, or
 * KWK_ELIMIT (failing c) past SCHEMA_STEPS_MAX. */
int sconv_step(struct sconv *c);
/* ptr + "/" + token (escaped as RFC 6901) into out[SCHEMA_PTR_MAX], "..." when too long. */
void ptr_child(char *out, const char *ptr, const char *token);
void ptr_index(char *out, const char *ptr, const char *kw, size_t i);
/* Add rule name ::= body (body is copied). A free name or one with the same body is reused,
 * else name0, name1... Returns the name (owned by the table) or NULL on failure. */
const char *rule_add(struct sconv *c, const char *name, const char *body);
/* The shared rules: space, value, string, number, char, date-string ... (and what they use). */
const char *rule_primitive(struct sconv *c, const char *name);
/* The rule for subschema s at ptr, named after name: *out is the rule name (owned by the
 * table) or NULL when s allows no value. Returns 0 or c->rc. */
int schema_visit(struct sconv *c, json_t *s, const char *ptr, const char *name,
                 const char **out);
/* Whether s is a $ref with annotations only (named after its target: ref-defs-node). */
int schema_pure_ref(json_t *s, char *name, size_t cap);
/* prefix-suffix, or suffix alone when prefix is empty (the root's children), sanitized. */
void rule_name_join(char *out, size_t cap, const char *prefix, const char *suffix);

/* schema_flat.c */
struct sflat *sflat_new(const char *ptr);
void sflat_free(struct sflat *f);
void sflist_clear(struct sflist *l);
/* Append the alternatives of schema s (at ptr) to out. Returns 0 or c->rc. */
int schema_flatten(struct sconv *c, json_t *s, const char *ptr, struct sflist *out);
/* JSON Schema equality (1 == 1.0). */
int json_schema_equal(const json_t *a, const json_t *b);
/* Whether a number is an integer by value (1.0 is). */
int json_is_integral(const json_t *v);

/* schema_oneof.c: 0 when the branches of a oneOf list (at ptr) are pairwise disjoint, else
 * KWK_EUNSUPPORTED naming two that may overlap. */
int schema_oneof_check(struct sconv *c, json_t *list, const char *ptr);

/* schema_gen.c: the GBNF body for one alternative (*body NULL: it allows nothing); *is_name is
 * set when the body is one rule name. */
int schema_gen_flat(struct sconv *c, const struct sflat *f, const char *name, char **body,
                    int *is_name);
/* a ("," space a){m-1,n-1} style repetition: item repeated min..max (max < 0: unbounded),
 * separated by sep (NULL: none). */
void gen_repetition(struct sbuf *b, const char *item, int64_t min, int64_t max, const char *sep);

/* schema_enum.c: the values of an enum that GBNF writes as one literal each, as their JSON
 * texts (not yet escaped for GBNF). */
struct slit {
    size_t off, len; /* the bytes text.p[off .. off + len) */
    const char *p;   /* text.p + off, once the text is complete */
};
struct slits {
    struct sbuf text; /* every literal's bytes, back to back */
    struct slit *v;   /* [n] */
    size_t n, cap;
};
/* Record the bytes appended to l->text since offset start as one literal: 0 or -ENOMEM. */
int slits_mark(struct slits *l, size_t start);
void slits_free(struct slits *l);
/* Append to b GBNF alternatives, joined by " | ", that match exactly l's literals (sorted and
 * deduplicated here): a prefix tree split between UTF-8 characters. nest: the groups already
 * open in b; a node deeper than SCHEMA_ENUM_NEST becomes a rule named after name. *n_alts gets
 * the number of alternatives written (0 when l is empty). Returns 0 or c->rc. */
int schema_enum_trie(struct sconv *c, struct slits *l, const char *name, int nest,
                     struct sbuf *b, int *n_alts);

/* schema_int.c: a GBNF expression for the integers in [lo, hi] (has_lo / has_hi: bounded). */
void gen_int_range(struct sbuf *b, int has_lo, int64_t lo, int has_hi, int64_t hi);

/* schema_regex.c: the body of a rule for JSON strings whose value matches an ECMA-262
 * pattern (unanchored unless ^ / $ say so). Refuses lookarounds, backreferences, \b, \p{..}. */
int schema_gen_pattern(struct sconv *c, const char *pattern, const char *ptr, const char *name,
                       char **body);

/* GBNF for one character cp in its canonical JSON spelling (a literal or a group). */
void gen_json_char_cp(struct sbuf *b, uint32_t cp);

/* Code point sets: sorted disjoint ranges. */
struct cpset {
    uint32_t lo[SCHEMA_CLASS_MAX], hi[SCHEMA_CLASS_MAX];
    int n;
    int over; /* more ranges than fit */
};
void cpset_add(struct cpset *s, uint32_t lo, uint32_t hi);
void cpset_normalize(struct cpset *s);
void cpset_negate(struct cpset *s);
int cpset_has(const struct cpset *s, uint32_t c);
/* GBNF alternatives for one JSON-string character of s in its one canonical spelling (raw
 * UTF-8, \" \\ \b \f \n \r \t, \u00XX for the other controls); nothing when s is empty. */
void cpset_gen_json_char(struct sbuf *b, const struct cpset *s);

#endif
