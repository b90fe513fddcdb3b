/* match.c - the pushdown engine: sets of stacks of grammar positions, advanced one byte at a
 * time (llama.cpp's idea), with stacks hash-consed into nodes so that equal stacks are one id
 * and a set of stacks is a sorted array of ids. Also kwk_grammar_match. An engine belongs to
 * one caller; kwk_grammar_match makes its own and is thread-safe. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

static uint32_t node_hash(uint32_t pos, uint32_t parent)
{
    uint32_t h = pos * 0x9E3779B1u ^ (parent + 0x7F4A7C15u) * 0x85EBCA77u;
    return h ^ h >> 15;
}

int kg_grow(void **p, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64, bytes;
    while (c < need)
        c *= 2;
    if (kwk_mul_size(c, sz, &bytes))
        return -ENOMEM;
    void *q = kwk_realloc(*p, bytes);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

static int slots_resize(struct kg_engine *e, uint32_t size)
{
    uint32_t *t = kwk_calloc(size, sizeof *t);
    if (!t)
        return -ENOMEM;
    for (uint32_t id = 1; id < e->n_nodes; id++) {
        uint32_t j = node_hash(e->nodes[id].pos, e->nodes[id].parent) & (size - 1);
        while (t[j])
            j = (j + 1) & (size - 1);
        t[j] = id + 1;
    }
    kwk_free(e->slots);
    e->slots = t;
    e->slot_mask = size - 1;
    return 0;
}

int kg_engine_init(struct kg_engine *e, const struct kwk_grammar *g)
{
    memset(e, 0, sizeof *e);
    e->g = g;
    e->cap_nodes = 1024;
    e->nodes = kwk_calloc(e->cap_nodes, sizeof *e->nodes);
    e->mark = kwk_calloc(e->cap_nodes, sizeof *e->mark);
    if (!e->nodes || !e->mark || slots_resize(e, 2048)) {
        kg_engine_free(e);
        return -ENOMEM;
    }
    e->n_nodes = 1; /* node 0: the empty stack */
    return 0;
}

void kg_engine_free(struct kg_engine *e)
{
    if (!e)
        return;
    kwk_free(e->nodes);
    kwk_free(e->mark);
    kwk_free(e->slots);
    kwk_free(e->work);
    kwk_free(e->out);
    memset(e, 0, sizeof *e);
}

size_t kg_engine_bytes(const struct kg_engine *e)
{
    return (size_t)e->cap_nodes * (sizeof *e->nodes + sizeof *e->mark) +
           ((size_t)e->slot_mask + 1) * sizeof *e->slots +
           (e->cap_work + e->cap_out) * sizeof *e->work;
}

/* The node of the stack `parent` with pos pushed. */
static int node_get(struct kg_engine *e, uint32_t pos, uint32_t parent, uint32_t *id)
{
    uint32_t j = node_hash(pos, parent) & e->slot_mask;
    for (; e->slots[j]; j = (j + 1) & e->slot_mask) {
        const struct kg_node *n = &e->nodes[e->slots[j] - 1];
        if (n->pos == pos && n->parent == parent) {
            *id = e->slots[j] - 1;
            return 0;
        }
    }
    uint32_t depth = e->nodes[parent].depth + 1;
    if (depth > KG_DEPTH_MAX || e->n_nodes >= KG_NODES_MAX)
        return KWK_ELIMIT;
    if (e->n_nodes == e->cap_nodes) {
        size_t cap = e->cap_nodes, cap2 = e->cap_nodes;
        if (kg_grow((void **)&e->nodes, &cap, cap + 1, sizeof *e->nodes) ||
            kg_grow((void **)&e->mark, &cap2, cap, sizeof *e->mark))
            return -ENOMEM;
        memset(e->mark + e->cap_nodes, 0, (cap - e->cap_nodes) * sizeof *e->mark);
        e->cap_nodes = (uint32_t)cap;
    }
    *id = e->n_nodes++;
    e->nodes[*id] = (struct kg_node){pos, parent, depth};
    e->mark[*id] = 0;
    e->slots[j] = *id + 1;
    if ((uint64_t)e->n_nodes * 2 > (uint64_t)e->slot_mask + 1)
        return slots_resize(e, (e->slot_mask + 1) * 2);
    return 0;
}

/* Queue a stack for expansion, once per step. */
static int visit(struct kg_engine *e, uint32_t id)
{
    if (e->mark[id] == e->stamp)
        return 0;
    e->mark[id] = e->stamp;
    if (kg_grow((void **)&e->work, &e->cap_work, e->n_work + 1, sizeof *e->work))
        return -ENOMEM;
    e->work[e->n_work++] = id;
    return 0;
}

static void stamp_next(struct kg_engine *e)
{
    if (++e->stamp == 0) { /* wrapped: old marks could look current */
        memset(e->mark, 0, (size_t)e->cap_nodes * sizeof *e->mark);
        e->stamp = 1;
    }
    e->n_work = 0;
    e->n_out = 0;
}

/* Expand one reference: the stack with the reference replaced by each of the rule's
 * alternatives, over what follows the reference (nothing more of the current alternative: the
 * frame is popped first, a tail call, so right recursion does not deepen the stack). */
static int expand_ref(struct kg_engine *e, uint32_t id)
{
    const struct kwk_grammar *g = e->g;
    uint32_t pos = e->nodes[id].pos, cont = e->nodes[id].parent, rule = kg_arg(g->elems[pos]);
    int rc = 0;
    if (kg_kind(g->elems[pos + 1]) != KG_END && (rc = node_get(e, pos + 1, cont, &cont)))
        return rc;
    for (uint32_t a = g->rule_alts[rule]; a < g->rule_alts[rule + 1] && !rc; a++) {
        uint32_t start = g->alts[a], child = cont;
        if (kg_kind(g->elems[start]) != KG_END)
            rc = node_get(e, start, cont, &child);
        if (!rc)
            rc = visit(e, child);
    }
    return rc;
}

static void sort_ids(uint32_t *a, size_t n);

/* Expand the queued stacks until every top is a byte set (or the stack is empty). */
static int close_set(struct kg_engine *e)
{
    uint32_t expanded = 0;
    int rc = 0;
    while (e->n_work && !rc) {
        uint32_t id = e->work[--e->n_work];
        if (id && kg_kind(e->g->elems[e->nodes[id].pos]) == KG_REF) {
            e->expansions++;
            rc = ++expanded > KG_CLOSURE_MAX ? KWK_ELIMIT : expand_ref(e, id);
            continue;
        }
        if (e->n_out >= KG_STACKS_MAX)
            return KWK_ELIMIT;
        if (kg_grow((void **)&e->out, &e->cap_out, e->n_out + 1, sizeof *e->out))
            return -ENOMEM;
        e->out[e->n_out++] = id;
    }
    if (!rc)
        sort_ids(e->out, e->n_out);
    return rc;
}

int kg_engine_start(struct kg_engine *e)
{
    uint32_t id;
    stamp_next(e);
    int rc = node_get(e, 0, 0, &id);
    if (!rc)
        rc = visit(e, id);
    return rc ? rc : close_set(e);
}

int kg_engine_step(struct kg_engine *e, const uint32_t *set, size_t n, unsigned byte)
{
    const struct kwk_grammar *g = e->g;
    int rc = 0;
    stamp_next(e);
    for (size_t i = 0; i < n && !rc; i++) {
        if (!set[i])
            continue;
        const struct kg_node *nd = &e->nodes[set[i]];
        uint32_t pos = nd->pos, next = nd->parent;
        if (!kg_set_has(g, kg_arg(g->elems[pos]), byte))
            continue;
        if (kg_kind(g->elems[pos + 1]) != KG_END)
            rc = node_get(e, pos + 1, next, &next);
        if (!rc)
            rc = visit(e, next);
    }
    return rc ? rc : close_set(e);
}

static int id_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void sort_ids(uint32_t *a, size_t n)
{
    if (n > 24) {
        qsort(a, n, sizeof *a, id_cmp);
        return;
    }
    for (size_t i = 1; i < n; i++) {
        uint32_t x = a[i];
        size_t j = i;
        for (; j > 0 && a[j - 1] > x; j--)
            a[j] = a[j - 1];
        a[j] = x;
    }
}

int kg_engine_compact(struct kg_engine *e, uint32_t *set, size_t n)
{
    /* Each stack's positions, bottom first, into the work buffer: [depth, positions...]. */
    size_t need = 0;
    for (size_t i = 0; i < n; i++)
        need += (size_t)e->nodes[set[i]].depth + 1;
    if (kg_grow((void **)&e->work, &e->cap_work, need, sizeof *e->work))
        goto fail;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t d = e->nodes[set[i]].depth, id = set[i];
        e->work[w] = d;
        for (uint32_t k = d; k > 0; k--, id = e->nodes[id].parent)
            e->work[w + k] = e->nodes[id].pos;
        w += (size_t)d + 1;
    }
    e->n_nodes = 1;
    memset(e->slots, 0, ((size_t)e->slot_mask + 1) * sizeof *e->slots);
    w = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t d = e->work[w], id = 0;
        for (uint32_t k = 1; k <= d; k++)
            if (node_get(e, e->work[w + k], id, &id))
                goto fail;
        set[i] = id;
        w += (size_t)d + 1;
    }
    e->n_work = 0;
    sort_ids(set, n);
    return 0;
fail:
    e->n_nodes = 1;
    memset(e->slots, 0, ((size_t)e->slot_mask + 1) * sizeof *e->slots);
    return -ENOMEM;
}

int kwk_grammar_match(const kwk_grammar *g, const char *text, size_t len, int *prefix)
{
    struct kg_engine e;
    uint32_t *cur = NULL;
    size_t n_cur = 0, cap_cur = 0;
    int rc;
    if (prefix)
        *prefix = 0;
    if (!g || (!text && len))
        return KWK_EARG;
    if ((rc = kg_engine_init(&e, g)))
        return rc;
    rc = kg_engine_start(&e);
    for (size_t i = 0; !rc; i++) {
        if (kg_grow((void **)&cur, &cap_cur, e.n_out, sizeof *cur)) {
            rc = -ENOMEM;
            break;
        }
        n_cur = e.n_out;
        if (n_cur)
            memcpy(cur, e.out, n_cur * sizeof *cur);
        if (i == len || !n_cur)
            break;
        /* The node table only grows: start over from the live stacks when it is large. */
        if (e.n_nodes > KG_NODES_COMPACT && (rc = kg_engine_compact(&e, cur, n_cur)))
            break;
        rc = kg_engine_step(&e, cur, n_cur, (unsigned char)text[i]);
    }
    if (!rc) {
        if (prefix)
            *prefix = n_cur > 0;
        rc = n_cur > 0 && cur[0] == 0;
    }
    kwk_free(cur);
    kg_engine_free(&e);
    return rc;
}
