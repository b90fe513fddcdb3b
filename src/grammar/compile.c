/* compile.c - a parsed grammar checked and flattened: every rule defined, `root` present, no
 * left recursion (the engine would grow a stack forever); alternatives that can never match a
 * whole text dropped, so every live stack can still complete a sentence; byte classes found
 * for the matcher's DFA. Any thread. */
#include <errno.h>
#include <string.h>

#include "grammar/grammar.h"

/* One alternative of a builder rule: body[start .. start + len). */
struct alt_ref {
    uint32_t rule, start, len;
};

static int alts_collect(const struct kg_builder *b, struct alt_ref **out, uint32_t *n_out)
{
    size_t n = 0;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        n++;
        for (uint32_t i = 0; i < b->rules[r].n; i++)
            n += kg_kind(b->rules[r].body[i]) == KG_ALT;
    }
    struct alt_ref *a = kwk_calloc(n ? n : 1, sizeof *a);
    if (!a)
        return -ENOMEM;
    n = 0;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        const struct kg_rule *R = &b->rules[r];
        uint32_t start = 0;
        for (uint32_t i = 0; i <= R->n; i++) {
            if (i < R->n && kg_kind(R->body[i]) != KG_ALT)
                continue;
            a[n++] = (struct alt_ref){r, start, i - start};
            start = i + 1;
        }
    }
    *out = a;
    *n_out = (uint32_t)n;
    return 0;
}

/* An alternative's elements (NULL when it has none: an empty rule has no body). */
static const uint32_t *alt_at(const struct kg_builder *b, const struct alt_ref *a)
{
    return a->len ? b->rules[a->rule].body + a->start : NULL;
}

static int set_empty(const struct kg_builder *b, uint32_t set)
{
    for (int i = 0; i < 8; i++)
        if (b->sets[set][i])
            return 0;
    return 1;
}

/* holds[r] = 1 for the rules with an alternative whose elements all hold. A byte set holds when
 * `productive` and it is not empty (productive: matches some text; else nullable: matches the
 * empty text, which no byte set does); a reference when its rule holds. Linear: each
 * alternative counts its references still unproven, and each rule proven lowers the counts of
 * the alternatives that use it. */
static int rules_holding(const struct kg_builder *b, const struct alt_ref *alts, uint32_t n_alts,
                         int productive, uint8_t *holds)
{
    uint32_t *need = kwk_calloc(n_alts ? n_alts : 1, sizeof *need);
    uint32_t *use_off = kwk_calloc((size_t)b->n_rules + 1, sizeof *use_off);
    uint32_t *queue = kwk_calloc((size_t)b->n_rules + 1, sizeof *queue);
    uint32_t *uses = kwk_calloc(b->n_elems ? b->n_elems : 1, sizeof *uses);
    uint32_t n_queue = 0;
    int rc = -ENOMEM;
    if (!need || !use_off || !queue || !uses)
        goto out;
    memset(holds, 0, b->n_rules);
    for (uint32_t a = 0; a < n_alts; a++) {
        const uint32_t *e = alt_at(b, &alts[a]);
        for (uint32_t i = 0; i < alts[a].len; i++) {
            if (kg_kind(e[i]) == KG_REF) {
                need[a] += need[a] != UINT32_MAX;
                use_off[kg_arg(e[i]) + 1]++;
            } else if (!productive || set_empty(b, kg_arg(e[i]))) {
                need[a] = UINT32_MAX;
            }
        }
    }
    for (uint32_t r = 0; r < b->n_rules; r++)
        use_off[r + 1] += use_off[r];
    for (uint32_t a = 0; a < n_alts; a++) {
        const uint32_t *e = alt_at(b, &alts[a]);
        for (uint32_t i = 0; i < alts[a].len; i++)
            if (kg_kind(e[i]) == KG_REF)
                uses[use_off[kg_arg(e[i])]++] = a;
    }
    for (uint32_t r = b->n_rules; r > 0; r--) /* back to starts */
        use_off[r] = use_off[r - 1];
    use_off[0] = 0;
    for (uint32_t a = 0; a < n_alts; a++) {
        if (need[a] == 0 && !holds[alts[a].rule]) {
            holds[alts[a].rule] = 1;
            queue[n_queue++] = alts[a].rule;
        }
    }
    while (n_queue) {
        uint32_t r = queue[--n_queue];
        for (uint32_t u = use_off[r]; u < use_off[r + 1]; u++) {
            uint32_t a = uses[u];
            if (need[a] == UINT32_MAX || --need[a] || holds[alts[a].rule])
                continue;
            holds[alts[a].rule] = 1;
            queue[n_queue++] = alts[a].rule;
        }
    }
    rc = 0;
out:
    kwk_free(need);
    kwk_free(use_off);
    kwk_free(queue);
    kwk_free(uses);
    return rc;
}

static int fail_rule(struct kg_builder *b, uint32_t r, int64_t pos, const char *what)
{
    const struct kg_rule *R = &b->rules[b->rules[r].origin];
    return kg_fail(b, KWK_ESYNTAX, pos < 0 ? 0 : (size_t)pos, "%s '%.*s'", what,
                   (int)R->name_len, b->s + R->name_off);
}

/* Left recursion: a rule that reaches itself through references preceded only by nullable
 * elements. Edges in CSR form, then an iterative depth-first search for a cycle. The
 * self-reference ending a `*` helper's alternative is left out: the engine pops that rule before
 * entering it again (a tail call), so the stack does not grow. */
static int check_left_recursion(struct kg_builder *b, const struct alt_ref *alts,
                                uint32_t n_alts, const uint8_t *nullable)
{
    uint32_t n = b->n_rules;
    uint32_t *off = kwk_calloc((size_t)n + 1, sizeof *off);
    uint32_t *to = kwk_calloc(b->n_elems ? b->n_elems : 1, sizeof *to);
    uint32_t *stack = kwk_calloc((size_t)n + 1, 2 * sizeof *stack);
    uint8_t *color = kwk_calloc((size_t)n + 1, 1);
    int rc = -ENOMEM;
    if (!off || !to || !stack || !color)
        goto out;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t a = 0; a < n_alts; a++) {
            const struct kg_rule *R = &b->rules[alts[a].rule];
            const uint32_t *e = alt_at(b, &alts[a]);
            for (uint32_t i = 0; i < alts[a].len && kg_kind(e[i]) == KG_REF; i++) {
                uint32_t s = kg_arg(e[i]);
                int loop = R->repeat && s == alts[a].rule && i + 1 == alts[a].len;
                if (!loop && pass == 0)
                    off[alts[a].rule + 1]++;
                else if (!loop)
                    to[off[alts[a].rule]++] = s;
                if (!nullable[s])
                    break;
            }
        }
        if (pass == 0) {
            for (uint32_t r = 0; r < n; r++)
                off[r + 1] += off[r];
        } else {
            for (uint32_t r = n; r > 0; r--)
                off[r] = off[r - 1];
            off[0] = 0;
        }
    }
    /* color: 0 unseen, 1 on the search path, 2 done. stack: (rule, next edge) pairs. */
    for (uint32_t r0 = 0; r0 < n; r0++) {
        if (color[r0])
            continue;
        uint32_t depth = 0;
        stack[0] = r0, stack[1] = off[r0];
        color[r0] = 1;
        depth = 1;
        while (depth) {
            uint32_t *top = &stack[2 * (depth - 1)];
            if (top[1] == off[top[0] + 1]) {
                color[top[0]] = 2;
                depth--;
                continue;
            }
            uint32_t s = to[top[1]++];
            if (color[s] == 1) {
                rc = fail_rule(b, s, b->rules[b->rules[s].origin].def_pos,
                               "left recursion: can reach itself before matching any text: rule");
                goto out;
            }
            if (color[s] == 0) {
                color[s] = 1;
                stack[2 * depth] = s, stack[2 * depth + 1] = off[s];
                depth++;
            }
        }
    }
    rc = 0;
out:
    kwk_free(off);
    kwk_free(to);
    kwk_free(stack);
    kwk_free(color);
    return rc;
}

/* Classes of bytes that every used set treats alike: each set splits the classes so far. */
static void byte_classes(struct kwk_grammar *g, const uint8_t *used)
{
    uint8_t cls[256] = {0}, next[256];
    int16_t map[256][2];
    uint32_t n = 1;
    for (uint32_t s = 0; s < g->n_sets; s++) {
        if (!used[s])
            continue;
        uint32_t m = 0;
        memset(map, 0xff, sizeof map);
        for (unsigned c = 0; c < 256; c++) {
            int h = kg_set_has(g, s, c);
            if (map[cls[c]][h] < 0)
                map[cls[c]][h] = (int16_t)m++;
            next[c] = (uint8_t)map[cls[c]][h];
        }
        memcpy(cls, next, sizeof cls);
        n = m;
    }
    memcpy(g->byte_class, cls, sizeof cls);
    g->n_classes = n;
    for (int c = 255; c >= 0; c--)
        g->class_byte[cls[c]] = (uint8_t)c;
}

static int alt_productive(const struct kg_builder *b, const struct alt_ref *a,
                          const uint8_t *productive)
{
    const uint32_t *e = alt_at(b, a);
    for (uint32_t i = 0; i < a->len; i++) {
        if (kg_kind(e[i]) == KG_REF ? !productive[kg_arg(e[i])] : set_empty(b, kg_arg(e[i])))
            return 0;
    }
    return 1;
}

/* The flat grammar: elements of the alternatives that can match, END after each. */
static int flatten(struct kg_builder *b, const struct alt_ref *alts, uint32_t n_alts,
                   const uint8_t *productive, uint32_t root, struct kwk_grammar *g)
{
    size_t n_elems = 2, n_kept = 0;
    for (uint32_t a = 0; a < n_alts; a++) {
        if (alt_productive(b, &alts[a], productive)) {
            n_elems += (size_t)alts[a].len + 1;
            n_kept++;
        }
    }
    uint8_t *used = kwk_calloc(b->n_sets ? b->n_sets : 1, 1);
    g->elems = kwk_calloc(n_elems, sizeof *g->elems);
    g->alts = kwk_calloc(n_kept ? n_kept : 1, sizeof *g->alts);
    g->rule_alts = kwk_calloc((size_t)b->n_rules + 1, sizeof *g->rule_alts);
    g->sets = kwk_calloc(b->n_sets ? b->n_sets : 1, sizeof *g->sets);
    if (!used || !g->elems || !g->alts || !g->rule_alts || !g->sets) {
        kwk_free(used);
        return -ENOMEM;
    }
    if (b->n_sets)
        memcpy(g->sets, b->sets, (size_t)b->n_sets * sizeof *g->sets);
    g->n_sets = b->n_sets;
    g->n_rules = b->n_rules;
    g->elems[0] = kg_elem(KG_REF, root);
    g->elems[1] = kg_elem(KG_END, 0);
    uint32_t n = 2, k = 0;
    for (uint32_t a = 0; a < n_alts; a++) {
        if (a == 0 || alts[a].rule != alts[a - 1].rule)
            g->rule_alts[alts[a].rule] = k;
        if (!alt_productive(b, &alts[a], productive))
            continue;
        g->alts[k++] = n;
        const uint32_t *e = alt_at(b, &alts[a]);
        for (uint32_t i = 0; i < alts[a].len; i++) {
            if (kg_kind(e[i]) == KG_BYTES)
                used[kg_arg(e[i])] = 1;
            g->elems[n++] = e[i];
        }
        g->elems[n++] = kg_elem(KG_END, 0);
    }
    g->rule_alts[b->n_rules] = k;
    g->n_alts = k;
    g->n_elems = n;
    byte_classes(g, used);
    kwk_free(used);
    return 0;
}

int kg_compile(struct kg_builder *b, struct kwk_grammar **out)
{
    struct alt_ref *alts = NULL;
    uint32_t n_alts = 0, root = UINT32_MAX;
    uint8_t *nullable = kwk_calloc((size_t)b->n_rules + 1, 1);
    uint8_t *productive = kwk_calloc((size_t)b->n_rules + 1, 1);
    struct kwk_grammar *g = kwk_calloc(1, sizeof *g);
    int rc = -ENOMEM;
    if (!nullable || !productive || !g || alts_collect(b, &alts, &n_alts))
        goto out;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        const struct kg_rule *R = &b->rules[r];
        if (R->name_len && R->def_pos < 0) {
            rc = fail_rule(b, r, R->ref_pos, "undefined rule");
            goto out;
        }
        if (R->name_len == 4 && !memcmp(b->s + R->name_off, "root", 4))
            root = r;
    }
    if (root == UINT32_MAX) {
        rc = kg_fail(b, KWK_ESYNTAX, 0, "no rule 'root' (the grammar's start)");
        goto out;
    }
    if ((rc = rules_holding(b, alts, n_alts, 0, nullable)) ||
        (rc = check_left_recursion(b, alts, n_alts, nullable)) ||
        (rc = rules_holding(b, alts, n_alts, 1, productive)))
        goto out;
    rc = flatten(b, alts, n_alts, productive, root, g);
out:
    if (rc == -ENOMEM)
        kwk_err_set(b->err, rc, "grammar: out of memory");
    if (rc) {
        kwk_grammar_free(g);
        g = NULL;
    }
    kwk_free(alts);
    kwk_free(nullable);
    kwk_free(productive);
    *out = g;
    return rc;
}

void kwk_grammar_free(kwk_grammar *g)
{
    if (!g)
        return;
    kwk_free(g->elems);
    kwk_free(g->alts);
    kwk_free(g->rule_alts);
    kwk_free(g->sets);
    kwk_free(g);
}
