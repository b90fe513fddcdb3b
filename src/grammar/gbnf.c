/* gbnf.c - GBNF text (llama.cpp's grammars/README.md) into a builder of byte-level rules:
 * literals become their UTF-8 bytes, character classes rules over byte ranges that accept
 * exactly the valid UTF-8 encodings of the class, repetitions helper rules. kg_compile
 * (compile.c) checks and flattens the result. Any thread (no shared state). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

#define CP_MAX 0x10FFFFu

/* A code point range, both ends included. */
struct cp_range {
    uint32_t lo, hi;
};

struct parser {
    struct kg_builder *b;
    const char *s;
    size_t n, pos;
    int nest;               /* parentheses open */
    uint32_t origin;        /* the user rule being parsed */
    struct cp_range *ranges; /* the class being parsed */
    size_t n_ranges, cap_ranges;
};

/* A growable run of elements (a rule body in the making). */
struct ebuf {
    uint32_t *p;
    size_t n, cap;
};

/* ---- errors ---- */

int kg_fail(struct kg_builder *b, int code, size_t pos, const char *fmt, ...)
{
    char msg[KWK_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < pos && i < b->n; i++) {
        if (b->s[i] == '\n') {
            line++;
            line_start = i + 1;
        }
    }
    int col = (int)(pos - line_start) + 1;
    kwk_err_set_pos(b->err, code, (int64_t)pos, "grammar: line %d, column %d: %s", line, col, msg);
    if (b->err) {
        b->err->line = line;
        b->err->col = col;
    }
    return code;
}

static int fail_nomem(struct kg_builder *b)
{
    return kwk_err_set(b->err, -ENOMEM, "grammar: out of memory");
}

/* ---- growable arrays ---- */

static int ebuf_push(struct ebuf *e, uint32_t x)
{
    if (kg_grow((void **)&e->p, &e->cap, e->n + 1, sizeof *e->p))
        return -ENOMEM;
    e->p[e->n++] = x;
    return 0;
}

/* ---- rules and sets ---- */

static int rule_new(struct kg_builder *b, uint32_t origin, uint32_t *id)
{
    if (b->n_rules >= KG_RULES_MAX)
        return kwk_err_set(b->err, KWK_ELIMIT, "grammar: more than %u rules", KG_RULES_MAX);
    size_t cap = b->cap_rules;
    if (kg_grow((void **)&b->rules, &cap, (size_t)b->n_rules + 1, sizeof *b->rules))
        return fail_nomem(b);
    b->cap_rules = (uint32_t)cap;
    struct kg_rule *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    r->def_pos = -1;
    r->ref_pos = -1;
    r->origin = origin;
    *id = b->n_rules++;
    return 0;
}

/* Append x to rule id's body, within the grammar's element budget. */
static int rule_push(struct kg_builder *b, uint32_t id, uint32_t x)
{
    if (b->n_elems >= KG_ELEMS_MAX)
        return kwk_err_set(b->err, KWK_ELIMIT,
                           "grammar: more than %u elements (repetitions expand into copies)",
                           KG_ELEMS_MAX);
    struct kg_rule *r = &b->rules[id];
    size_t cap = r->cap;
    if (kg_grow((void **)&r->body, &cap, (size_t)r->n + 1, sizeof *r->body))
        return fail_nomem(b);
    r->cap = (uint32_t)cap;
    r->body[r->n++] = x;
    b->n_elems++;
    return 0;
}

static int rule_push_run(struct kg_builder *b, uint32_t id, const uint32_t *x, size_t n)
{
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = rule_push(b, id, x[i]);
    return rc;
}

static void rule_truncate(struct kg_builder *b, uint32_t id, uint32_t n)
{
    b->n_elems -= b->rules[id].n - n;
    b->rules[id].n = n;
}

static uint32_t hash_bytes(const void *p, size_t n)
{
    const uint8_t *s = p;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 16777619u;
    return h;
}

/* Double an open-addressing table of ids + 1 (hash(id) says where each goes). */
static int slots_grow(uint32_t **slots, uint32_t *mask, uint32_t used,
                      uint32_t (*hash)(struct kg_builder *, uint32_t), struct kg_builder *b)
{
    if (*slots && (uint64_t)(used + 1) * 2 <= (uint64_t)*mask + 1)
        return 0;
    uint32_t size = *slots ? (*mask + 1) * 2 : 64;
    uint32_t *t = kwk_calloc(size, sizeof *t);
    if (!t)
        return -ENOMEM;
    for (uint32_t i = 0; *slots && i <= *mask; i++) {
        if (!(*slots)[i])
            continue;
        uint32_t j = hash(b, (*slots)[i] - 1) & (size - 1);
        while (t[j])
            j = (j + 1) & (size - 1);
        t[j] = (*slots)[i];
    }
    kwk_free(*slots);
    *slots = t;
    *mask = size - 1;
    return 0;
}

static uint32_t set_hash(struct kg_builder *b, uint32_t id)
{
    return hash_bytes(b->sets[id], sizeof b->sets[id]);
}

/* The id of byte set `set`, added when new. */
static int set_intern(struct kg_builder *b, const uint32_t set[8], uint32_t *id)
{
    if (slots_grow(&b->set_slots, &b->set_mask, b->n_sets, set_hash, b))
        return fail_nomem(b);
    uint32_t j = hash_bytes(set, 32) & b->set_mask;
    for (; b->set_slots[j]; j = (j + 1) & b->set_mask) {
        if (!memcmp(b->sets[b->set_slots[j] - 1], set, 32)) {
            *id = b->set_slots[j] - 1;
            return 0;
        }
    }
    size_t cap = b->cap_sets;
    if (kg_grow((void **)&b->sets, &cap, (size_t)b->n_sets + 1, sizeof *b->sets))
        return fail_nomem(b);
    b->cap_sets = (uint32_t)cap;
    memcpy(b->sets[b->n_sets], set, 32);
    b->set_slots[j] = b->n_sets + 1;
    *id = b->n_sets++;
    return 0;
}

static void set_add_range(uint32_t set[8], unsigned lo, unsigned hi)
{
    for (unsigned c = lo; c <= hi; c++)
        set[c >> 5] |= 1u << (c & 31);
}

/* The KG_BYTES element of the bytes lo..hi. */
static int bytes_elem(struct kg_builder *b, unsigned lo, unsigned hi, uint32_t *e)
{
    uint32_t set[8] = {0}, id;
    set_add_range(set, lo, hi);
    int rc = set_intern(b, set, &id);
    *e = kg_elem(KG_BYTES, id);
    return rc;
}

static uint32_t name_hash(struct kg_builder *b, uint32_t id)
{
    return hash_bytes(b->s + b->rules[id].name_off, b->rules[id].name_len);
}

/* The user rule named s[off .. off + len), made (undefined) when new. */
static int rule_named(struct kg_builder *b, size_t off, uint32_t len, uint32_t *id)
{
    if (slots_grow(&b->name_slots, &b->name_mask, b->n_rules, name_hash, b))
        return fail_nomem(b);
    uint32_t j = hash_bytes(b->s + off, len) & b->name_mask;
    for (; b->name_slots[j]; j = (j + 1) & b->name_mask) {
        const struct kg_rule *r = &b->rules[b->name_slots[j] - 1];
        if (r->name_len == len && !memcmp(b->s + r->name_off, b->s + off, len)) {
            *id = b->name_slots[j] - 1;
            return 0;
        }
    }
    int rc = rule_new(b, b->n_rules, id);
    if (rc)
        return rc;
    b->rules[*id].name_off = off;
    b->rules[*id].name_len = len;
    b->name_slots[j] = *id + 1;
    return 0;
}

/* ---- code point sets as UTF-8 byte rules ---- */

/* The code points encoded in k bytes, surrogates left out. */
static const struct cp_range utf8_domain[4][2] = {
    {{0, 0x7F}, {1, 0}},
    {{0x80, 0x7FF}, {1, 0}},
    {{0x800, 0xD7FF}, {0xE000, 0xFFFF}},
    {{0x10000, CP_MAX}, {1, 0}},
};

/* The ranges of s[n] that meet [lo, hi]: how the node covering [lo, hi] is covered.
 * 0 = not at all, 1 = wholly, 2 = in part. */
static int cover(const struct cp_range *s, size_t n, uint32_t lo, uint32_t hi)
{
    size_t a = 0, z = n;
    while (a < z) { /* first range ending at or after lo */
        size_t m = a + (z - a) / 2;
        if (s[m].hi < lo)
            a = m + 1;
        else
            z = m;
    }
    if (a == n || s[a].lo > hi)
        return 0;
    return s[a].lo <= lo && s[a].hi >= hi ? 1 : 2;
}

/* One group of a node's children: the bytes that lead to the same continuation. */
struct utf8_group {
    uint32_t set[8];
    struct ebuf sub;
};

static int utf8_children(struct parser *P, const struct cp_range *s, size_t n, unsigned byte0,
                         unsigned n_children, uint32_t lo, unsigned child_r, struct ebuf *out);

/* Append to out the alternatives (KG_ALT between them) of one group: its byte set, then the
 * continuation, inline when it is one alternative and a rule of its own otherwise. */
static int utf8_emit_group(struct parser *P, struct utf8_group *gr, struct ebuf *out)
{
    uint32_t e, id;
    int rc = set_intern(P->b, gr->set, &id);
    if (rc)
        return rc;
    if (out->n && ebuf_push(out, kg_elem(KG_ALT, 0)))
        return fail_nomem(P->b);
    if (ebuf_push(out, kg_elem(KG_BYTES, id)))
        return fail_nomem(P->b);
    int one_alt = 1;
    for (size_t i = 0; i < gr->sub.n; i++)
        one_alt &= kg_kind(gr->sub.p[i]) != KG_ALT;
    if (one_alt) {
        for (size_t i = 0; i < gr->sub.n; i++)
            if (ebuf_push(out, gr->sub.p[i]))
                return fail_nomem(P->b);
        return 0;
    }
    if ((rc = rule_new(P->b, P->origin, &id)) || (rc = rule_push_run(P->b, id, gr->sub.p,
                                                                      gr->sub.n)))
        return rc;
    e = kg_elem(KG_REF, id);
    return ebuf_push(out, e) ? fail_nomem(P->b) : 0;
}

/* The children of a node of the UTF-8 byte tree: child i is byte byte0 + i and covers the
 * code points [lo + i * 64^child_r, lo + (i + 1) * 64^child_r), child_r bytes still to come.
 * Children wholly in s share one alternative; the others are grouped by their continuation. */
static int utf8_children(struct parser *P, const struct cp_range *s, size_t n, unsigned byte0,
                         unsigned n_children, uint32_t lo, unsigned child_r, struct ebuf *out)
{
    struct utf8_group groups[65];
    unsigned n_groups = 1;
    uint32_t span = 1u << (6 * child_r);
    int rc = 0;
    memset(groups, 0, sizeof groups);
    for (unsigned i = 0; i < n_children && !rc; i++) {
        uint32_t clo = lo + i * span;
        int c = cover(s, n, clo, clo + span - 1);
        if (c == 1) {
            groups[0].set[(byte0 + i) >> 5] |= 1u << ((byte0 + i) & 31);
            continue;
        }
        if (c == 0)
            continue;
        struct ebuf sub = {0};
        rc = utf8_children(P, s, n, 0x80, 64, clo, child_r - 1, &sub);
        unsigned g = 1;
        while (!rc && g < n_groups && (groups[g].sub.n != sub.n ||
                                       memcmp(groups[g].sub.p, sub.p, sub.n * sizeof *sub.p)))
            g++;
        if (g == n_groups && !rc) {
            groups[n_groups++].sub = sub;
            sub.p = NULL;
        }
        if (!rc)
            groups[g].set[(byte0 + i) >> 5] |= 1u << ((byte0 + i) & 31);
        kwk_free(sub.p);
    }
    /* The whole children's continuation: child_r bytes of 80..BF. */
    static const uint32_t none[8];
    if (!rc && memcmp(groups[0].set, none, sizeof none)) {
        uint32_t cont = 0;
        rc = child_r ? bytes_elem(P->b, 0x80, 0xBF, &cont) : 0;
        for (unsigned k = 0; k < child_r && !rc; k++)
            rc = ebuf_push(&groups[0].sub, cont) ? fail_nomem(P->b) : 0;
        if (!rc)
            rc = utf8_emit_group(P, &groups[0], out);
    }
    for (unsigned g = 1; g < n_groups && !rc; g++)
        rc = utf8_emit_group(P, &groups[g], out);
    for (unsigned g = 0; g < n_groups; g++)
        kwk_free(groups[g].sub.p);
    return rc;
}

/* The alternatives matching the UTF-8 encodings of the code points in s[n] (sorted, disjoint). */
static int utf8_set(struct parser *P, const struct cp_range *s, size_t n, struct ebuf *out)
{
    static const unsigned lead0[4] = {0x00, 0xC0, 0xE0, 0xF0};
    static const unsigned n_leads[4] = {128, 32, 16, 8};
    struct cp_range *sk = NULL;
    int rc = 0;
    size_t cap = 0;
    for (unsigned k = 0; k < 4 && !rc; k++) {
        size_t nk = 0;
        for (unsigned d = 0; d < 2; d++) {
            const struct cp_range *dom = &utf8_domain[k][d];
            for (size_t i = 0; i < n && dom->lo <= dom->hi; i++) {
                uint32_t a = KWK_MAX(s[i].lo, dom->lo), z = KWK_MIN(s[i].hi, dom->hi);
                if (a > z)
                    continue;
                if (kg_grow((void **)&sk, &cap, nk + 1, sizeof *sk)) {
                    rc = fail_nomem(P->b);
                    break;
                }
                sk[nk++] = (struct cp_range){a, z};
            }
        }
        if (!rc && nk)
            rc = utf8_children(P, sk, nk, lead0[k], n_leads[k], 0, k, out);
    }
    kwk_free(sk);
    return rc;
}

/* ---- the parser ---- */

static int at(const struct parser *P, size_t i)
{
    return P->pos + i < P->n ? (unsigned char)P->s[P->pos + i] : -1;
}

static int is_word(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-';
}

/* Spaces, tabs and comments; newlines too where the construct may span lines. */
static void skip_space(struct parser *P, int newline_ok)
{
    for (;;) {
        int c = at(P, 0);
        if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
            P->pos++;
        } else if (c == '#') {
            while (at(P, 0) >= 0 && at(P, 0) != '\r' && at(P, 0) != '\n')
                P->pos++;
        } else {
            return;
        }
    }
}

static int fail(struct parser *P, size_t pos, const char *what)
{
    return kg_fail(P->b, KWK_ESYNTAX, pos, "%s", what);
}

/* One UTF-8 character of the text (strict: no overlongs, surrogates or truncation). */
static int decode_utf8(struct parser *P, uint32_t *cp)
{
    int c = at(P, 0), len;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = (uint32_t)c;
        P->pos++;
        return 0;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2, v = (uint32_t)c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3, v = (uint32_t)c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, v = (uint32_t)c & 0x07, min = 0x10000;
    } else {
        return fail(P, P->pos, "invalid UTF-8 byte");
    }
    for (int i = 1; i < len; i++) {
        int d = at(P, (size_t)i);
        if (d < 0x80 || d > 0xBF)
            return fail(P, P->pos, "invalid UTF-8 sequence");
        v = v << 6 | ((uint32_t)d & 0x3F);
    }
    if (v < min || v > CP_MAX || (v >= 0xD800 && v <= 0xDFFF))
        return fail(P, P->pos, "invalid UTF-8 sequence (overlong, surrogate or past U+10FFFF)");
    *cp = v;
    P->pos += (size_t)len;
    return 0;
}

/* One character of a literal or class, escapes decoded. */
static int parse_char(struct parser *P, uint32_t *cp)
{
    size_t start = P->pos;
    if (at(P, 0) != '\\')
        return decode_utf8(P, cp);
    int c = at(P, 1), digits = 0;
    switch (c) {
    case 'n': *cp = '\n'; break;
    case 'r': *cp = '\r'; break;
    case 't': *cp = '\t'; break;
    case '\\': case '"': case '[': case ']': case '-': *cp = (uint32_t)c; break;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default:
        return fail(P, start, c < 0 ? "unexpected end of text after '\\'"
                                    : "unknown escape (expected one of \\n \\r \\t \\\\ \\\" "
                                      "\\[ \\] \\- \\xHH \\uHHHH \\UHHHHHHHH)");
    }
    P->pos += 2;
    if (!digits)
        return 0;
    uint64_t v = 0;
    for (int i = 0; i < digits; i++) {
        int d = kwk_hex_digit(at(P, 0));
        if (d < 0) {
            char msg[64];
            snprintf(msg, sizeof msg, "expected %d hex digits after \\%c", digits, c);
            return fail(P, P->pos, msg);
        }
        v = v << 4 | (uint64_t)d;
        P->pos++;
    }
    if (v > CP_MAX)
        return fail(P, start, "escape past U+10FFFF");
    *cp = (uint32_t)v;
    return 0;
}

static int utf8_encode(uint32_t cp, uint8_t out[4])
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* "..." after the opening quote: the UTF-8 bytes of its characters. */
static int parse_literal(struct parser *P, uint32_t rule)
{
    size_t open = P->pos - 1;
    int rc = 0;
    while (!rc && at(P, 0) != '"') {
        if (at(P, 0) < 0)
            return fail(P, open, "unterminated literal (expected '\"')");
        size_t cpos = P->pos;
        uint32_t cp;
        uint8_t u[4];
        if ((rc = parse_char(P, &cp)))
            return rc;
        if (cp >= 0xD800 && cp <= 0xDFFF)
            return fail(P, cpos, "a surrogate code point has no UTF-8 encoding");
        int k = utf8_encode(cp, u);
        for (int i = 0; i < k && !rc; i++) {
            uint32_t e;
            rc = bytes_elem(P->b, u[i], u[i], &e);
            if (!rc)
                rc = rule_push(P->b, rule, e);
        }
    }
    P->pos++;
    return rc;
}

static int range_cmp(const void *a, const void *b)
{
    const struct cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sort and merge P->ranges; with negate, replace them by their complement in [0, U+10FFFF]. */
static int ranges_normalize(struct parser *P, int negate)
{
    struct cp_range *r = P->ranges;
    size_t n = 0;
    if (P->n_ranges)
        qsort(r, P->n_ranges, sizeof *r, range_cmp);
    for (size_t i = 0; i < P->n_ranges; i++) {
        if (n && r[i].lo <= r[n - 1].hi + 1)
            r[n - 1].hi = KWK_MAX(r[n - 1].hi, r[i].hi);
        else
            r[n++] = r[i];
    }
    P->n_ranges = n;
    if (!negate)
        return 0;
    /* The complement has at most one range more. */
    if (kg_grow((void **)&P->ranges, &P->cap_ranges, n + 1, sizeof *P->ranges))
        return fail_nomem(P->b);
    r = P->ranges;
    uint32_t next = 0;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        struct cp_range cur = r[i];
        if (cur.lo > next)
            r[m++] = (struct cp_range){next, cur.lo - 1};
        next = cur.hi + 1;
    }
    if (next <= CP_MAX)
        r[m++] = (struct cp_range){next, CP_MAX};
    P->n_ranges = m;
    return 0;
}

/* The current code point set as elements of rule: inline when it is one run of bytes, else
 * a rule of its own. A set with no valid encodings becomes a byte set that matches nothing. */
static int emit_ranges(struct parser *P, uint32_t rule)
{
    struct ebuf alts = {0};
    int rc = utf8_set(P, P->ranges, P->n_ranges, &alts);
    int one_alt = 1;
    for (size_t i = 0; i < alts.n; i++)
        one_alt &= kg_kind(alts.p[i]) != KG_ALT;
    if (rc)
        goto out;
    if (!alts.n) {
        uint32_t none[8] = {0}, id;
        if (!(rc = set_intern(P->b, none, &id)))
            rc = rule_push(P->b, rule, kg_elem(KG_BYTES, id));
    } else if (one_alt) {
        rc = rule_push_run(P->b, rule, alts.p, alts.n);
    } else {
        uint32_t id;
        if (!(rc = rule_new(P->b, P->origin, &id)) &&
            !(rc = rule_push_run(P->b, id, alts.p, alts.n)))
            rc = rule_push(P->b, rule, kg_elem(KG_REF, id));
    }
out:
    kwk_free(alts.p);
    return rc;
}

/* [...] after the opening bracket. */
static int parse_class(struct parser *P, uint32_t rule)
{
    size_t open = P->pos - 1;
    int negate = at(P, 0) == '^';
    int rc = 0;
    P->pos += (size_t)negate;
    P->n_ranges = 0;
    while (at(P, 0) != ']') {
        if (at(P, 0) < 0)
            return fail(P, open, "unterminated character class (expected ']')");
        size_t cpos = P->pos;
        uint32_t lo, hi;
        if ((rc = parse_char(P, &lo)))
            return rc;
        hi = lo;
        if (at(P, 0) == '-' && at(P, 1) != ']' && at(P, 1) >= 0) {
            P->pos++;
            if ((rc = parse_char(P, &hi)))
                return rc;
            if (hi < lo)
                return fail(P, cpos, "character range out of order (its end is before its start)");
        }
        if (kg_grow((void **)&P->ranges, &P->cap_ranges, P->n_ranges + 1, sizeof *P->ranges))
            return fail_nomem(P->b);
        P->ranges[P->n_ranges++] = (struct cp_range){lo, hi};
    }
    P->pos++;
    if ((rc = ranges_normalize(P, negate)))
        return rc;
    return emit_ranges(P, rule);
}

/* Move rule's elements from start on into a new rule: a symbol about to be repeated or copied
 * becomes one reference. */
static int symbol_wrap(struct parser *P, uint32_t rule, uint32_t start)
{
    uint32_t id;
    int rc = rule_new(P->b, P->origin, &id);
    if (rc)
        return rc;
    for (uint32_t i = start; i < P->b->rules[rule].n && !rc; i++)
        rc = rule_push(P->b, id, P->b->rules[rule].body[i]);
    if (rc)
        return rc;
    rule_truncate(P->b, rule, start);
    return rule_push(P->b, rule, kg_elem(KG_REF, id));
}

/* A rule `s ::= x s |` for x*; its id in *id. */
static int star_rule(struct parser *P, uint32_t x, uint32_t *id)
{
    int rc = rule_new(P->b, P->origin, id);
    if (!rc && !(rc = rule_push(P->b, *id, x)) &&
        !(rc = rule_push(P->b, *id, kg_elem(KG_REF, *id))))
        rc = rule_push(P->b, *id, kg_elem(KG_ALT, 0));
    if (!rc)
        P->b->rules[*id].repeat = 1;
    return rc;
}

/* Repeat the symbol at rule[start ..] between min and max times (max UINT32_MAX: no bound).
 * x{m,n} is m copies of x, then n - m nested optional ones `o1 ::= x o2 |` ...: O(n) elements,
 * since x is first made one reference. */
static int repeat_symbol(struct parser *P, uint32_t rule, uint32_t start, uint32_t min,
                         uint32_t max)
{
    struct kg_builder *b = P->b;
    int rc = 0;
    if (b->rules[rule].n == start)
        return 0; /* an empty literal repeated is still empty */
    if (b->rules[rule].n - start > 1 && (rc = symbol_wrap(P, rule, start)))
        return rc;
    uint32_t x = b->rules[rule].body[start], id;
    rule_truncate(b, rule, start);
    for (uint32_t i = 0; i < min && !rc; i++)
        rc = rule_push(b, rule, x);
    if (rc || max == min)
        return rc;
    if (max == UINT32_MAX) {
        if (!(rc = star_rule(P, x, &id)))
            rc = rule_push(b, rule, kg_elem(KG_REF, id));
        return rc;
    }
    /* Innermost first: each optional rule refers to the next one. */
    uint32_t next = 0;
    for (uint32_t i = 0; i < max - min && !rc; i++) {
        if ((rc = rule_new(b, P->origin, &id)) || (rc = rule_push(b, id, x)))
            break;
        if (i && (rc = rule_push(b, id, kg_elem(KG_REF, next))))
            break;
        rc = rule_push(b, id, kg_elem(KG_ALT, 0));
        next = id;
    }
    return rc ? rc : rule_push(b, rule, kg_elem(KG_REF, next));
}

static int parse_count(struct parser *P, uint32_t *v)
{
    size_t start = P->pos;
    uint64_t x = 0;
    if (at(P, 0) < '0' || at(P, 0) > '9')
        return fail(P, P->pos, "expected a number");
    while (at(P, 0) >= '0' && at(P, 0) <= '9') {
        x = x * 10 + (uint64_t)(at(P, 0) - '0');
        if (x > KWK_GRAMMAR_REPEAT_MAX)
            return kg_fail(P->b, KWK_ELIMIT, start, "repetition count over %d",
                           KWK_GRAMMAR_REPEAT_MAX);
        P->pos++;
    }
    *v = (uint32_t)x;
    return 0;
}

/* {m} {m,} {m,n} after the opening brace. */
static int parse_braces(struct parser *P, uint32_t *min, uint32_t *max)
{
    size_t open = P->pos - 1;
    int rc;
    skip_space(P, 0);
    if ((rc = parse_count(P, min)))
        return rc;
    skip_space(P, 0);
    *max = *min;
    if (at(P, 0) == ',') {
        P->pos++;
        skip_space(P, 0);
        *max = UINT32_MAX;
        if (at(P, 0) >= '0' && at(P, 0) <= '9' && (rc = parse_count(P, max)))
            return rc;
        skip_space(P, 0);
    }
    if (at(P, 0) != '}')
        return fail(P, P->pos, "expected '}' or ',' in a repetition {m,n}");
    P->pos++;
    if (*max < *min)
        return fail(P, open, "repetition {m,n} with n < m");
    return 0;
}

static int parse_alternates(struct parser *P, uint32_t rule, int nested);

/* ( ... ) after the opening parenthesis: a rule of its own, inlined when it is one sequence. */
static int parse_group(struct parser *P, uint32_t rule)
{
    size_t open = P->pos - 1;
    uint32_t id;
    int rc;
    if (P->nest >= KG_NEST_MAX)
        return kg_fail(P->b, KWK_ELIMIT, open, "parentheses nested deeper than %d",
                       KG_NEST_MAX);
    if ((rc = rule_new(P->b, P->origin, &id)))
        return rc;
    P->nest++;
    skip_space(P, 1);
    rc = parse_alternates(P, id, 1);
    P->nest--;
    if (rc)
        return rc;
    if (at(P, 0) != ')')
        return fail(P, P->pos, "expected ')'");
    P->pos++;
    struct kg_rule *g = &P->b->rules[id];
    int one_alt = 1;
    for (uint32_t i = 0; i < g->n; i++)
        one_alt &= kg_kind(g->body[i]) != KG_ALT;
    if (!one_alt || id + 1 != P->b->n_rules)
        return rule_push(P->b, rule, kg_elem(KG_REF, id));
    /* One sequence, no rule made since: copy it in and drop the group's rule. */
    for (uint32_t i = 0; i < P->b->rules[id].n && !rc; i++)
        rc = rule_push(P->b, rule, P->b->rules[id].body[i]);
    if (!rc) {
        rule_truncate(P->b, id, 0);
        kwk_free(P->b->rules[id].body);
        P->b->n_rules--;
    }
    return rc;
}

/* A name used as a symbol. */
static int parse_ref(struct parser *P, uint32_t rule)
{
    size_t start = P->pos;
    uint32_t id;
    while (is_word(at(P, 0)))
        P->pos++;
    int rc = rule_named(P->b, start, (uint32_t)(P->pos - start), &id);
    if (rc)
        return rc;
    if (P->b->rules[id].ref_pos < 0)
        P->b->rules[id].ref_pos = (int64_t)start;
    return rule_push(P->b, rule, kg_elem(KG_REF, id));
}

static int parse_sequence(struct parser *P, uint32_t rule, int nested)
{
    uint32_t sym = UINT32_MAX; /* where the last symbol starts in rule's body */
    for (;;) {
        int c = at(P, 0), rc = 0;
        size_t here = P->pos;
        uint32_t min = 0, max = 0;
        if (c == '"' || c == '[' || c == '(' || c == '.' || is_word(c))
            sym = P->b->rules[rule].n;
        if (c == '"') {
            P->pos++;
            rc = parse_literal(P, rule);
        } else if (c == '[') {
            P->pos++;
            rc = parse_class(P, rule);
        } else if (c == '(') {
            P->pos++;
            rc = parse_group(P, rule);
        } else if (c == '.') {
            P->pos++;
            P->n_ranges = 0;
            if (!(rc = ranges_normalize(P, 1)))
                rc = emit_ranges(P, rule);
        } else if (is_word(c)) {
            rc = parse_ref(P, rule);
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            P->pos++;
            if (sym == UINT32_MAX)
                return fail(P, here, "expected an item before a repetition operator");
            if (c == '{')
                rc = parse_braces(P, &min, &max);
            else
                min = c == '+', max = c == '?' ? 1 : UINT32_MAX;
            if (!rc)
                rc = repeat_symbol(P, rule, sym, min, max);
        } else {
            return 0;
        }
        if (rc)
            return rc;
        skip_space(P, nested);
    }
}

static int parse_alternates(struct parser *P, uint32_t rule, int nested)
{
    int rc = parse_sequence(P, rule, nested);
    while (!rc && at(P, 0) == '|') {
        P->pos++;
        skip_space(P, 1);
        if (!(rc = rule_push(P->b, rule, kg_elem(KG_ALT, 0))))
            rc = parse_sequence(P, rule, nested);
    }
    return rc;
}

/* name ::= alternatives, ending at a newline or the end of the text. */
static int parse_rule(struct parser *P)
{
    size_t start = P->pos;
    uint32_t id;
    int rc;
    while (is_word(at(P, 0)))
        P->pos++;
    if (P->pos == start)
        return fail(P, start, "expected a rule name");
    if ((rc = rule_named(P->b, start, (uint32_t)(P->pos - start), &id)))
        return rc;
    if (P->b->rules[id].def_pos >= 0)
        return fail(P, start, "rule defined twice");
    P->b->rules[id].def_pos = (int64_t)start;
    P->origin = id;
    skip_space(P, 0);
    if (at(P, 0) != ':' || at(P, 1) != ':' || at(P, 2) != '=')
        return fail(P, P->pos, "expected '::='");
    P->pos += 3;
    skip_space(P, 1);
    if ((rc = parse_alternates(P, id, 0)))
        return rc;
    if (at(P, 0) == '\r')
        P->pos++;
    if (at(P, 0) == '\n')
        P->pos++;
    else if (at(P, 0) >= 0)
        return fail(P, P->pos, "expected a symbol, '|' or the end of the line");
    return 0;
}

static void builder_free(struct kg_builder *b)
{
    for (uint32_t i = 0; i < b->n_rules; i++)
        kwk_free(b->rules[i].body);
    kwk_free(b->rules);
    kwk_free(b->name_slots);
    kwk_free(b->sets);
    kwk_free(b->set_slots);
}

kwk_grammar *kwk_grammar_new(const char *text, size_t len, struct kwk_err *err)
{
    struct kg_builder b = {.s = text, .n = len, .err = err};
    struct parser P = {.b = &b, .s = text, .n = len};
    kwk_grammar *g = NULL;
    int rc = 0;
    kwk_err_clear(err);
    if (!text && len) {
        kwk_err_set(err, KWK_EARG, "grammar: NULL text");
        return NULL;
    }
    if (len > KWK_GRAMMAR_TEXT_MAX) {
        kwk_err_set(err, KWK_ELIMIT, "grammar: text of %zu bytes, over the %d limit", len,
                    KWK_GRAMMAR_TEXT_MAX);
        return NULL;
    }
    skip_space(&P, 1);
    while (!rc && at(&P, 0) >= 0) {
        rc = parse_rule(&P);
        skip_space(&P, 1);
    }
    if (!rc)
        rc = kg_compile(&b, &g);
    kwk_free(P.ranges);
    builder_free(&b);
    return rc ? NULL : g;
}
