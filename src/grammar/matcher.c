/* matcher.c - one generation's position in a grammar (kwk_matcher: one sequence, one thread).
 *
 * The engine's sets of stacks become the states of a DFA built lazily: each set met is
 * interned once, and its transition on each byte class is computed the first time it is needed
 * and then read from a table. A mask walks the vocabulary trie with one table read per trie
 * node, so inside a JSON string, where the same few sets recur token after token, it costs a
 * pass over the trie and no stack work. The last masks are kept by state, since a state often
 * comes back (each token of a long string). The tables grow with the states met; past
 * MATCHER_SOFT_BYTES they are dropped between calls and rebuilt from the current state. */
#include <errno.h>
#include <string.h>

#include "grammar/grammar.h"

#define ST_UNKNOWN UINT32_MAX       /* a transition not computed yet */
#define ST_DEAD (UINT32_MAX - 1)    /* no stack takes the byte */
#define MATCHER_SOFT_BYTES (16u << 20) /* tables dropped between calls past this */
#define MATCHER_HARD_BYTES (256u << 20) /* KWK_ELIMIT past this within one call */
#define MATCHER_STATES_MAX (1u << 24)
#define MASK_CACHE 4                /* masks kept */
/* Rule expansions one mask, check or accept may do while computing new transitions: bounds
 * the time a hostile grammar can hold the generating thread (the engine's, shared by every
 * request) to about 0.1 s; a JSON schema's first mask inside a string over a 128k vocabulary
 * needs about a tenth of it. */
#define MATCHER_CALL_WORK_MAX (1u << 22)

struct mstate {
    uint32_t off, len; /* its stacks: pool[off .. off + len), sorted node ids */
    uint32_t hash;
    uint32_t loops_known; /* loop holds self_loops' answer */
    uint64_t loop[2];
};

struct mask_entry {
    uint32_t state;    /* ST_UNKNOWN: empty */
    int32_t count;
    uint64_t used;     /* when last read (LRU) */
    uint32_t *bits;    /* [words] */
};

struct kwk_matcher {
    const kwk_grammar *g;
    const kwk_grammar_vocab *v;
    struct kg_engine e;
    uint32_t *pool;          /* node ids of every state */
    size_t n_pool, cap_pool;
    struct mstate *states;
    size_t n_states, cap_states;
    uint32_t *trans;         /* [n_states][g->n_classes] next state, ST_DEAD or ST_UNKNOWN */
    size_t cap_trans;        /* in states */
    uint32_t *slots;         /* hash of states -> id + 1 */
    uint32_t slot_mask;
    uint32_t cur, start;     /* start: ST_UNKNOWN until computed since the last flush */
    uint32_t *walk;          /* [v->max_len + 1] state at each depth of a trie walk */
    struct mask_entry cache[MASK_CACHE];
    uint64_t clock;
    int32_t *kept; /* [n_kept] preserved special tokens: matched as their bytes */
    int n_kept;
};

static uint32_t ids_hash(const uint32_t *ids, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ids[i]) * 16777619u;
    return h ^ h >> 13;
}

static size_t matcher_bytes(const kwk_matcher *m)
{
    return kg_engine_bytes(&m->e) + m->cap_pool * sizeof *m->pool +
           m->cap_states * sizeof *m->states +
           m->cap_trans * m->g->n_classes * sizeof *m->trans +
           ((size_t)m->slot_mask + 1) * sizeof *m->slots;
}

/* Bytes of table in use (capacity is kept after a flush, so the budget counts use). */
static size_t matcher_used(const kwk_matcher *m)
{
    return (size_t)m->e.n_nodes * (sizeof *m->e.nodes + sizeof *m->e.mark + 2 * sizeof(uint32_t)) +
           m->n_pool * sizeof *m->pool +
           m->n_states * (sizeof *m->states + m->g->n_classes * sizeof *m->trans);
}

static int slots_resize(kwk_matcher *m, uint32_t size)
{
    uint32_t *t = kwk_calloc(size, sizeof *t);
    if (!t)
        return -ENOMEM;
    for (size_t s = 0; s < m->n_states; s++) {
        uint32_t j = m->states[s].hash & (size - 1);
        while (t[j])
            j = (j + 1) & (size - 1);
        t[j] = (uint32_t)s + 1;
    }
    kwk_free(m->slots);
    m->slots = t;
    m->slot_mask = size - 1;
    return 0;
}

/* The state of the set ids[n] (sorted), made when new. */
static int state_intern(kwk_matcher *m, const uint32_t *ids, size_t n, uint32_t *out)
{
    uint32_t h = ids_hash(ids, n), j = h & m->slot_mask;
    for (; m->slots[j]; j = (j + 1) & m->slot_mask) {
        const struct mstate *st = &m->states[m->slots[j] - 1];
        if (st->hash == h && st->len == n && !memcmp(m->pool + st->off, ids, n * sizeof *ids)) {
            *out = m->slots[j] - 1;
            return 0;
        }
    }
    if (m->n_states >= MATCHER_STATES_MAX || matcher_bytes(m) > MATCHER_HARD_BYTES)
        return KWK_ELIMIT;
    size_t nc = m->g->n_classes;
    if (kg_grow((void **)&m->pool, &m->cap_pool, m->n_pool + n, sizeof *m->pool) ||
        kg_grow((void **)&m->states, &m->cap_states, m->n_states + 1, sizeof *m->states))
        return -ENOMEM;
    if (m->n_states == m->cap_trans) {
        size_t c = m->cap_trans ? m->cap_trans * 2 : 64, bytes;
        if (kwk_mul_size(c, nc * sizeof *m->trans, &bytes))
            return -ENOMEM;
        uint32_t *t = kwk_realloc(m->trans, bytes);
        if (!t)
            return -ENOMEM;
        m->trans = t;
        m->cap_trans = c;
    }
    memset(m->trans + m->n_states * nc, 0xff, nc * sizeof *m->trans); /* ST_UNKNOWN */
    if (n)
        memcpy(m->pool + m->n_pool, ids, n * sizeof *ids);
    m->states[m->n_states] = (struct mstate){(uint32_t)m->n_pool, (uint32_t)n, h, 0, {0, 0}};
    m->n_pool += n;
    *out = (uint32_t)m->n_states++;
    m->slots[j] = *out + 1;
    if ((uint64_t)m->n_states * 2 > (uint64_t)m->slot_mask + 1)
        return slots_resize(m, (m->slot_mask + 1) * 2);
    return 0;
}

/* Work out state s's transition on byte (its class's entry of the table). */
static int transition_compute(kwk_matcher *m, uint32_t s, unsigned byte, uint32_t *next)
{
    const struct mstate *st = &m->states[s];
    if (m->e.expansions > MATCHER_CALL_WORK_MAX)
        return KWK_ELIMIT;
    int rc = kg_engine_step(&m->e, m->pool + st->off, st->len, byte);
    if (rc)
        return rc;
    *next = ST_DEAD;
    if (m->e.n_out && (rc = state_intern(m, m->e.out, m->e.n_out, next)))
        return rc;
    m->trans[(size_t)s * m->g->n_classes + m->g->byte_class[byte]] = *next;
    return 0;
}

static inline int transition(kwk_matcher *m, uint32_t s, unsigned byte, uint32_t *next)
{
    *next = m->trans[(size_t)s * m->g->n_classes + m->g->byte_class[byte]];
    return *next == ST_UNKNOWN ? transition_compute(m, s, byte, next) : 0;
}

static void tables_clear(kwk_matcher *m)
{
    m->n_pool = 0;
    m->n_states = 0;
    memset(m->slots, 0, ((size_t)m->slot_mask + 1) * sizeof *m->slots);
    m->start = ST_UNKNOWN;
    for (int i = 0; i < MASK_CACHE; i++)
        m->cache[i].state = ST_UNKNOWN;
}

/* Drop every state but the current one (and every node but its stacks'). When that fails
 * (memory) the position is lost: the matcher is dead until kwk_matcher_reset. */
static int flush(kwk_matcher *m)
{
    const struct mstate *st = &m->states[m->cur];
    size_t n = st->len;
    uint32_t *ids = kwk_malloc(n * sizeof *ids + 1);
    int rc = -ENOMEM;
    if (!ids)
        goto out;
    memcpy(ids, m->pool + st->off, n * sizeof *ids);
    rc = kg_engine_compact(&m->e, ids, n);
    tables_clear(m);
    if (!rc)
        rc = state_intern(m, ids, n, &m->cur);
out:
    if (rc) {
        tables_clear(m);
        m->cur = ST_DEAD;
    }
    kwk_free(ids);
    return rc;
}

int kg_matcher_flush(kwk_matcher *m)
{
    return m->cur == ST_DEAD ? 0 : flush(m);
}

/* Before each call: keep the tables within their budget. */
static int maybe_flush(kwk_matcher *m)
{
    if (matcher_used(m) <= MATCHER_SOFT_BYTES && m->e.n_nodes <= KG_NODES_COMPACT)
        return 0;
    return flush(m);
}

/* The grammar's start as the current state (ST_DEAD for a grammar that matches nothing). */
static int start_state(kwk_matcher *m)
{
    int rc = kg_engine_start(&m->e);
    m->cur = ST_DEAD;
    if (!rc && m->e.n_out)
        rc = state_intern(m, m->e.out, m->e.n_out, &m->cur);
    m->start = m->cur;
    return rc;
}

void kwk_matcher_reset(kwk_matcher *m)
{
    if (!m)
        return;
    if (m->start != ST_UNKNOWN) {
        m->cur = m->start;
        return;
    }
    /* After a flush: from scratch (the start state is small; failure leaves cur dead). */
    tables_clear(m);
    kg_engine_free(&m->e);
    if (kg_engine_init(&m->e, m->g) || start_state(m))
        m->cur = ST_DEAD;
}

void kwk_matcher_free(kwk_matcher *m)
{
    if (!m)
        return;
    kg_engine_free(&m->e);
    kwk_free(m->pool);
    kwk_free(m->states);
    kwk_free(m->trans);
    kwk_free(m->slots);
    kwk_free(m->walk);
    kwk_free(m->kept);
    for (int i = 0; i < MASK_CACHE; i++)
        kwk_free(m->cache[i].bits);
    kwk_free(m);
}

kwk_matcher *kwk_matcher_new(const kwk_grammar *g, const kwk_grammar_vocab *v,
                             struct kwk_err *err)
{
    kwk_err_clear(err);
    if (!g || !v) {
        kwk_err_set(err, KWK_EARG, "matcher: NULL grammar or vocabulary");
        return NULL;
    }
    kwk_matcher *m = kwk_calloc(1, sizeof *m);
    int rc = -ENOMEM;
    if (!m)
        goto fail;
    m->g = g;
    m->v = v;
    m->walk = kwk_calloc((size_t)v->max_len + 1, sizeof *m->walk);
    if (!m->walk || slots_resize(m, 256) || kg_engine_init(&m->e, g))
        goto fail;
    tables_clear(m);
    if ((rc = start_state(m)))
        goto fail;
    return m;
fail:
    kwk_err_set(err, rc, "matcher: %s at the grammar's start", kwk_status_str(rc));
    kwk_matcher_free(m);
    return NULL;
}

/* The state after bytes[len] from the current one: 0, 1 when some byte is refused (ST_DEAD), or
 * a negative code. */
static int walk_bytes(kwk_matcher *m, const uint8_t *bytes, size_t len, uint32_t *out)
{
    uint32_t s = m->cur;
    int rc = maybe_flush(m);
    if (rc)
        return rc;
    s = m->cur;
    for (size_t i = 0; i < len; i++) {
        if (s == ST_DEAD || (rc = transition(m, s, bytes[i], &s)))
            return rc ? rc : 1;
    }
    *out = s;
    return s == ST_DEAD;
}

/* A special token with bytes in the vocabulary (outside its trie), which a matcher may
 * preserve. */
static int held(const struct kwk_grammar_vocab *v, int32_t token)
{
    return !v->usable[token] && v->off[token + 1] > v->off[token];
}

static int is_kept(const kwk_matcher *m, int32_t token)
{
    for (int k = 0; k < m->n_kept; k++)
        if (m->kept[k] == token)
            return 1;
    return 0;
}

int kwk_matcher_preserve(kwk_matcher *m, const int32_t *ids, int n)
{
    if (!m || n < 0 || (n && !ids))
        return KWK_EARG;
    if (n == 0) /* every constrained generation asks: no allocation for none */
        return 0;
    int32_t *k = kwk_realloc(m->kept, ((size_t)m->n_kept + (size_t)n + 1) * sizeof *k);
    if (!k)
        return -ENOMEM;
    m->kept = k;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < m->v->n_vocab && held(m->v, ids[i]) && !is_kept(m, ids[i]))
            m->kept[m->n_kept++] = ids[i];
    for (int i = 0; i < MASK_CACHE; i++) /* the masks made without them */
        m->cache[i].state = ST_UNKNOWN;
    return 0;
}

static int token_bytes(const kwk_matcher *m, int32_t token, const uint8_t **p, size_t *n)
{
    const struct kwk_grammar_vocab *v = m->v;
    if (token < 0 || token >= v->n_vocab)
        return KWK_ERANGE;
    *p = (const uint8_t *)v->bytes + v->off[token];
    *n = v->off[token + 1] - v->off[token];
    return v->usable[token] || is_kept(m, token) ? 0 : KWK_EARG;
}

int kwk_matcher_allows(kwk_matcher *m, int32_t token)
{
    const uint8_t *p;
    size_t n;
    uint32_t s;
    if (!m || m->cur == ST_DEAD || token_bytes(m, token, &p, &n))
        return 0;
    m->e.expansions = 0;
    int rc = walk_bytes(m, p, n, &s);
    return rc < 0 ? rc : rc == 0;
}

int kwk_matcher_accept_bytes(kwk_matcher *m, const char *bytes, size_t len)
{
    uint32_t s;
    if (!m || (!bytes && len))
        return KWK_EARG;
    if (m->cur == ST_DEAD)
        return KWK_EARG;
    m->e.expansions = 0;
    int rc = walk_bytes(m, (const uint8_t *)bytes, len, &s);
    if (rc)
        return rc < 0 ? rc : KWK_EARG;
    m->cur = s;
    return 0;
}

int kwk_matcher_accept(kwk_matcher *m, int32_t token)
{
    const uint8_t *p;
    size_t n;
    if (!m)
        return KWK_EARG;
    int rc = token_bytes(m, token, &p, &n);
    return rc ? rc : kwk_matcher_accept_bytes(m, (const char *)p, n);
}

int kwk_matcher_done(const kwk_matcher *m)
{
    if (!m || m->cur == ST_DEAD)
        return 0;
    const struct mstate *st = &m->states[m->cur];
    return st->len > 0 && m->pool[st->off] == 0;
}

int kwk_matcher_finished(const kwk_matcher *m)
{
    return kwk_matcher_done(m) && m->states[m->cur].len == 1;
}

/* Whether every non-ASCII character keeps state s alive and, once whole, brings it back to s:
 * then a subtree of valid UTF-8 under s may be passed over for its non-ASCII bytes. Explores
 * the pairs (grammar state, UTF-8 decoder state) reached from (s, boundary). */
static int utf8_closed(kwk_matcher *m, uint32_t s, int *closed)
{
    enum { PAIRS_MAX = 64 };
    uint32_t st[PAIRS_MAX];
    uint8_t q8[PAIRS_MAX];
    int n = 1;
    st[0] = s, q8[0] = KV_U8_START;
    *closed = 0;
    for (int k = 0; k < n; k++) {
        for (unsigned b = 0x80; b < 0x100; b++) {
            int q = kv_utf8_next(q8[k], b), rc, j;
            uint32_t t;
            if (q == KV_U8_BAD)
                continue;
            if ((rc = transition(m, st[k], b, &t)))
                return rc;
            if (t == ST_DEAD || (q == KV_U8_START && t != s))
                return 0;
            for (j = 0; j < n && (st[j] != t || q8[j] != q); j++)
                ;
            if (j < n || q == KV_U8_START)
                continue;
            if (n == PAIRS_MAX)
                return 0; /* too many ways through a character to prove it: walk instead */
            st[n] = t, q8[n++] = (uint8_t)q;
        }
    }
    *closed = 1;
    return 0;
}

/* Which subtree summaries (kv_node sub bits) only hold bytes that take state s back to s
 * (worked out once per state). */
static int self_loops(kwk_matcher *m, uint32_t s, uint64_t loop[2])
{
    const struct kwk_grammar *g = m->g;
    uint8_t back[256];
    int closed;
    if (m->states[s].loops_known) {
        loop[0] = m->states[s].loop[0], loop[1] = m->states[s].loop[1];
        return 0;
    }
    for (uint32_t c = 0; c < g->n_classes; c++) {
        uint32_t t;
        int rc = transition(m, s, g->class_byte[c], &t);
        if (rc)
            return rc;
        back[c] = t == s;
    }
    loop[0] = loop[1] = 0;
    for (unsigned b = 2; b < 0x80; b++)
        loop[b >> 6] |= (uint64_t)back[g->byte_class[b]] << (b & 63);
    loop[0] |= (uint64_t)(back[g->byte_class[0]] & back[g->byte_class[1]]) << 1;
    int rc = utf8_closed(m, s, &closed);
    loop[0] |= (uint64_t)closed; /* bit 0: bytes >= 0x80, in subtrees of valid UTF-8 */
    if (!rc) {
        m->states[s].loops_known = 1;
        m->states[s].loop[0] = loop[0], m->states[s].loop[1] = loop[1];
    }
    return rc;
}

/* One pass over the trie in preorder: a node's state is its parent's advanced by its byte;
 * a dead node skips its whole subtree, and so does a subtree under the starting state whose
 * ASCII bytes all lead back to it and whose other bytes are valid UTF-8 that does too (inside
 * a JSON string, most of the vocabulary): all its tokens are allowed, and their bits are set
 * without walking it. */
static int32_t mask_walk(kwk_matcher *m, uint32_t *allowed)
{
    const struct kwk_grammar_vocab *v = m->v;
    const struct kv_node *nodes = v->nodes;
    const uint8_t *cls = m->g->byte_class;
    size_t nc = m->g->n_classes;
    uint32_t root = m->cur, i = 0;
    uint64_t loop[2];
    int32_t count = 0;
    int rc = self_loops(m, root, loop);
    if (rc)
        return rc;
    m->walk[0] = root;
    while (i < v->n_nodes) {
        const struct kv_node *nd = &nodes[i];
        uint32_t s = m->walk[nd->depth - 1], first = nd->tok, last;
        if (s == root && !(v->sub[i][0] & ~loop[0]) && !(v->sub[i][1] & ~loop[1]) &&
            (nd->utf8 || !(v->sub[i][0] & 1))) {
            i = nd->end;
            last = nodes[i].tok;
        } else {
            uint32_t t = m->trans[(size_t)s * nc + cls[nd->byte]];
            if (t == ST_UNKNOWN && (rc = transition_compute(m, s, nd->byte, &t)))
                return rc;
            if (t == ST_DEAD) {
                i = nd->end;
                continue;
            }
            m->walk[nd->depth] = t;
            last = nodes[++i].tok;
        }
        for (uint32_t k = first; k < last; k++) {
            int32_t tok = v->node_toks[k];
            allowed[tok >> 5] |= 1u << (tok & 31);
        }
        count += (int32_t)(last - first);
    }
    /* the preserved tokens are not in the trie: each is walked on its own (a few) */
    for (int k = 0; k < m->n_kept; k++) {
        int32_t tok = m->kept[k];
        uint32_t s = root;
        for (size_t b = v->off[tok]; s != ST_DEAD && b < v->off[tok + 1]; b++)
            if ((rc = transition(m, s, (uint8_t)v->bytes[b], &s)))
                return rc;
        if (s != ST_DEAD) {
            allowed[tok >> 5] |= 1u << (tok & 31);
            count++;
        }
    }
    return count;
}

int32_t kg_matcher_mask_walk(kwk_matcher *m, uint32_t *allowed)
{
    memset(allowed, 0, ((size_t)m->v->n_vocab + 31) / 32 * sizeof *allowed);
    if (m->cur == ST_DEAD)
        return 0;
    int rc = maybe_flush(m);
    return rc ? rc : mask_walk(m, allowed);
}

size_t kg_matcher_bytes(const kwk_matcher *m, size_t *n_states)
{
    *n_states = m->n_states;
    return matcher_bytes(m);
}

int32_t kwk_matcher_mask(kwk_matcher *m, uint32_t *allowed)
{
    if (!m || !allowed)
        return KWK_EARG;
    size_t words = ((size_t)m->v->n_vocab + 31) / 32;
    memset(allowed, 0, words * sizeof *allowed);
    if (m->cur == ST_DEAD)
        return 0;
    int rc = maybe_flush(m);
    if (rc)
        return rc;
    struct mask_entry *lru = &m->cache[0];
    for (int i = 0; i < MASK_CACHE; i++) {
        struct mask_entry *c = &m->cache[i];
        if (c->state == m->cur) {
            c->used = ++m->clock;
            memcpy(allowed, c->bits, words * sizeof *allowed);
            return c->count;
        }
        if (c->used < lru->used)
            lru = c;
    }
    m->e.expansions = 0;
    int32_t count = mask_walk(m, allowed);
    if (count < 0) {
        memset(allowed, 0, words * sizeof *allowed);
        return count;
    }
    if (!lru->bits)
        lru->bits = kwk_malloc(words * sizeof *lru->bits + 1);
    if (lru->bits) { /* no room for the cache is no error */
        memcpy(lru->bits, allowed, words * sizeof *allowed);
        lru->state = m->cur;
        lru->count = count;
        lru->used = ++m->clock;
    }
    return count;
}
