/* tok_bpe.c - the BPE model: a word's characters (or bytes, for byte-level vocabularies) become
 * symbols that are merged lowest rank first, leftmost on ties, with a binary heap over a linked
 * list of symbols; byte_fallback, unk fusing, ignore_merges and a per-call word cache as HF's
 * BPE does. Any thread: all state is in the caller's scratch. */
#include <pthread.h>
#include <string.h>

#include "text/tokenizer.h"

struct sym {
    int32_t id, prev, next, alive;
};

struct merge {
    int32_t rank, pos, left, right, id;
};

static int merge_less(const struct merge *a, const struct merge *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct merge *h, size_t *n, struct merge m)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(&m, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static struct merge heap_pop(struct merge *h, size_t *n)
{
    struct merge top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const struct merge *best = &last;
        if (l < *n && merge_less(&h[l], best)) {
            m = l;
            best = &h[l];
        }
        if (r < *n && merge_less(&h[r], best))
            m = r;
        if (m == i)
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n)
        h[i] = last;
    return top;
}

struct word {
    struct sym *s;
    size_t n, cap;
    int oom;
};

static void word_add(struct word *w, int32_t id)
{
    if (w->oom)
        return;
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        struct sym *p = kwk_realloc(w->s, cap * sizeof *p);
        if (!p) {
            w->oom = 1;
            return;
        }
        w->s = p;
        w->cap = cap;
    }
    int32_t i = (int32_t)w->n++;
    w->s[i] = (struct sym){id, i - 1, -1, 1};
    if (i > 0)
        w->s[i - 1].next = i;
}

/* The word's initial symbols, as HF's BPE::merge_word builds them. */
static void initial_symbols(const struct kwk_tokenizer *t, const char *w, size_t n,
                            struct word *wd)
{
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++) {
            int32_t id = t->byte_ids[(uint8_t)w[i]];
            if (id >= 0)
                word_add(wd, id);
            else if (t->unk_id >= 0 && !(t->fuse_unk && wd->n && wd->s[wd->n - 1].id == t->unk_id))
                word_add(wd, t->unk_id);
        }
        return;
    }
    int32_t pending_unk = 0; /* 1 when an unk is waiting to be added (fuse_unk) */
    char tmp[64];
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tok_utf8_next(w + i, n - i, &cp);
        const char *key = w + i;
        size_t kn = l;
        int last = i + l >= n;
        if ((i > 0 && t->cont_prefix) || (last && t->end_suffix)) {
            size_t pl = i > 0 ? t->cont_prefix_len : 0, sl = last ? t->end_suffix_len : 0;
            if (pl + l + sl <= sizeof tmp) {
                if (pl)
                    memcpy(tmp, t->cont_prefix, pl);
                memcpy(tmp + pl, w + i, l);
                if (sl)
                    memcpy(tmp + pl + l, t->end_suffix, sl);
                key = tmp;
                kn = pl + l + sl;
            }
        }
        int32_t id = tok_map_get(&t->vocab, key, kn);
        if (id >= 0) {
            if (pending_unk) {
                word_add(wd, t->unk_id);
                pending_unk = 0;
            }
            word_add(wd, id);
        } else {
            int done = 0;
            if (t->byte_fallback) {
                done = 1;
                for (size_t k = 0; k < kn; k++)
                    if (t->fallback_ids[(uint8_t)key[k]] < 0)
                        done = 0;
                if (done)
                    for (size_t k = 0; k < kn; k++)
                        word_add(wd, t->fallback_ids[(uint8_t)key[k]]);
            }
            if (!done && t->unk_id >= 0) {
                if (pending_unk && !t->fuse_unk)
                    word_add(wd, t->unk_id);
                pending_unk = 1;
            }
        }
        i += l;
    }
    if (pending_unk)
        word_add(wd, t->unk_id);
}

static int merge_word(const struct kwk_tokenizer *t, struct word *wd)
{
    size_t cap = wd->n * 2 + 8, hn = 0;
    struct merge stackh[128];
    struct merge *h = stackh;
    if (cap > 128) {
        h = kwk_malloc(cap * sizeof *h);
        if (!h)
            return -12;
    }
    for (size_t i = 0; i + 1 < wd->n; i++) {
        const struct tok_pair_slot *p = tok_pairmap_get(&t->merges, wd->s[i].id, wd->s[i + 1].id);
        if (p)
            heap_push(h, &hn,
                      (struct merge){p->rank, (int32_t)i, wd->s[i].id, wd->s[i + 1].id, p->id});
    }
    while (hn) {
        struct merge m = heap_pop(h, &hn);
        struct sym *a = &wd->s[m.pos];
        if (!a->alive || a->next < 0 || a->id != m.left)
            continue;
        struct sym *b = &wd->s[a->next];
        if (b->id != m.right)
            continue;
        const struct tok_pair_slot *p;
        a->id = m.id;
        b->alive = 0;
        a->next = b->next;
        if (b->next >= 0)
            wd->s[b->next].prev = m.pos;
        /* Each merge removes a symbol and adds at most two pairs: cap never overflows. */
        if (a->prev >= 0) {
            struct sym *q = &wd->s[a->prev];
            p = tok_pairmap_get(&t->merges, q->id, a->id);
            if (p)
                heap_push(h, &hn, (struct merge){p->rank, a->prev, q->id, a->id, p->id});
        }
        if (a->next >= 0) {
            struct sym *q = &wd->s[a->next];
            p = tok_pairmap_get(&t->merges, a->id, q->id);
            if (p)
                heap_push(h, &hn, (struct merge){p->rank, m.pos, a->id, q->id, p->id});
        }
    }
    if (h != stackh)
        kwk_free(h);
    return 0;
}

/* ---- shared word cache ----------------------------------------------------------------
 * Short words and their ids, direct-mapped by hash: a later word that lands on the same slot
 * replaces the earlier one. Each shard of slots has its own mutex, so threads encoding at once
 * rarely wait; the cache only memoizes, so the tokenizer's results stay those of an immutable
 * object. */

#define GC_SLOTS (1u << 15)
#define GC_SHARDS 64
#define GC_WORD 26
#define GC_IDS 6

struct gc_slot {
    uint64_t hash; /* 0 = empty */
    uint8_t len, n_ids;
    char word[GC_WORD];
    int32_t ids[GC_IDS];
};

struct tok_gcache {
    pthread_mutex_t locks[GC_SHARDS];
    struct gc_slot slots[GC_SLOTS];
};

int tok_gcache_new(struct kwk_tokenizer *t)
{
    struct tok_gcache *c = kwk_calloc(1, sizeof *c);
    if (!c)
        return -12;
    for (int i = 0; i < GC_SHARDS; i++)
        pthread_mutex_init(&c->locks[i], NULL);
    t->gcache = c;
    return 0;
}

void tok_gcache_free(struct kwk_tokenizer *t)
{
    if (!t->gcache)
        return;
    for (int i = 0; i < GC_SHARDS; i++)
        pthread_mutex_destroy(&t->gcache->locks[i]);
    kwk_free(t->gcache);
    t->gcache = NULL;
}

static int gc_get(struct tok_gcache *c, const char *w, size_t n, uint64_t h, struct tok_ids *out)
{
    size_t i = h & (GC_SLOTS - 1);
    struct gc_slot *s = &c->slots[i], copy;
    pthread_mutex_t *lk = &c->locks[i % GC_SHARDS];
    pthread_mutex_lock(lk);
    copy = *s;
    pthread_mutex_unlock(lk);
    if (copy.hash != h || copy.len != n || memcmp(copy.word, w, n))
        return 0;
    for (int k = 0; k < copy.n_ids; k++)
        tok_ids_push(out, copy.ids[k]);
    return 1;
}

static void gc_put(struct tok_gcache *c, const char *w, size_t n, uint64_t h, const int32_t *ids,
                   size_t n_ids)
{
    size_t i = h & (GC_SLOTS - 1);
    struct gc_slot s = {.hash = h, .len = (uint8_t)n, .n_ids = (uint8_t)n_ids};
    memcpy(s.word, w, n);
    if (n_ids) /* a word may yield no ids (ids is then NULL) */
        memcpy(s.ids, ids, n_ids * sizeof *ids);
    pthread_mutex_t *lk = &c->locks[i % GC_SHARDS];
    pthread_mutex_lock(lk);
    c->slots[i] = s;
    pthread_mutex_unlock(lk);
}

/* ---- per-call word cache ------------------------------------------------------------- */

#define CACHE_MAX_WORD 256
#define CACHE_MAX_SLOTS (1u << 17)

static const struct tok_cache_slot *cache_get(struct tok_scratch *s, const char *w, size_t n,
                                              uint64_t h)
{
    if (!s->cache)
        return NULL;
    for (size_t i = h & s->cache_mask;; i = (i + 1) & s->cache_mask) {
        const struct tok_cache_slot *c = &s->cache[i];
        if (!c->used)
            return NULL;
        if (c->hash == h && c->key_len == n && !memcmp(s->cache_keys.p + c->key_off, w, n))
            return c;
    }
}

static void cache_put(struct tok_scratch *s, const char *w, size_t n, uint64_t h,
                      const int32_t *ids, size_t n_ids)
{
    if (!s->cache) {
        /* Small first: most calls are short prompts; the table doubles as words arrive. */
        s->cache = kwk_calloc(256, sizeof *s->cache);
        if (!s->cache)
            return;
        s->cache_mask = 255;
    }
    if ((s->cache_n + 1) * 2 > s->cache_mask + 1) {
        size_t cap = (s->cache_mask + 1) * 2;
        if (cap > CACHE_MAX_SLOTS)
            return;
        struct tok_cache_slot *nc = kwk_calloc(cap, sizeof *nc);
        if (!nc)
            return;
        for (size_t i = 0; i <= s->cache_mask; i++)
            if (s->cache[i].used) {
                size_t j = s->cache[i].hash & (cap - 1);
                while (nc[j].used)
                    j = (j + 1) & (cap - 1);
                nc[j] = s->cache[i];
            }
        kwk_free(s->cache);
        s->cache = nc;
        s->cache_mask = cap - 1;
    }
    size_t key_off = s->cache_keys.n, ids_off = s->cache_ids.n;
    tok_buf_add(&s->cache_keys, w, n);
    for (size_t i = 0; i < n_ids; i++)
        tok_ids_push(&s->cache_ids, ids[i]);
    if (s->cache_keys.oom || s->cache_ids.oom)
        return;
    size_t i = h & s->cache_mask;
    while (s->cache[i].used)
        i = (i + 1) & s->cache_mask;
    s->cache[i] = (struct tok_cache_slot){h, (uint32_t)key_off, (uint32_t)n, (uint32_t)ids_off,
                                          (uint32_t)n_ids, 1};
    s->cache_n++;
}

static int bpe_word(const struct kwk_tokenizer *t, struct tok_scratch *s, const char *w, size_t n,
                    struct tok_ids *out);

/* SentencePiece-style text with no pre-tokenizer is one long word; when no merge can produce
 * "x▁", cutting before every "▁" that follows another character gives the same tokens and lets
 * the word cache work. */
int tok_bpe_word(const struct kwk_tokenizer *t, struct tok_scratch *s, const char *w, size_t n,
                 struct tok_ids *out)
{
    static const char ms[3] = {(char)0xE2, (char)0x96, (char)0x81};
    if (!t->split_at_metaspace || n <= 64)
        return bpe_word(t, s, w, n, out);
    size_t start = 0;
    for (size_t i = 3; i + 3 <= n; i++) {
        if (memcmp(w + i, ms, 3) || !memcmp(w + i - 3, ms, 3))
            continue;
        int rc = bpe_word(t, s, w + start, i - start, out);
        if (rc)
            return rc;
        start = i;
    }
    return bpe_word(t, s, w + start, n - start, out);
}

static int bpe_word(const struct kwk_tokenizer *t, struct tok_scratch *s, const char *w, size_t n,
                    struct tok_ids *out)
{
    uint64_t h = 0;
    int shared = t->gcache && n <= GC_WORD;
    int cacheable = !shared && n <= CACHE_MAX_WORD && s->cache_keys.n < (1u << 30);
    if (shared) {
        h = tok_hash(w, n) | 1;
        if (gc_get(t->gcache, w, n, h, out))
            return out->oom ? -12 : 0;
    }
    if (cacheable) {
        h = tok_hash(w, n);
        const struct tok_cache_slot *c = cache_get(s, w, n, h);
        if (c) {
            for (uint32_t i = 0; i < c->n_ids; i++)
                tok_ids_push(out, s->cache_ids.p[c->ids_off + i]);
            return out->oom ? -12 : 0;
        }
    }
    if (t->ignore_merges) {
        int32_t id = t->byte_level ? tok_map_get(&t->vocab_raw, w, n) : tok_map_get(&t->vocab, w, n);
        if (id >= 0) {
            tok_ids_push(out, id);
            return out->oom ? -12 : 0;
        }
    }
    struct word wd = {0};
    int rc = 0;
    initial_symbols(t, w, n, &wd);
    if (wd.oom) {
        rc = -12;
        goto out;
    }
    rc = merge_word(t, &wd);
    if (rc)
        goto out;
    size_t start = out->n;
    for (size_t i = 0; i < wd.n; i++)
        if (wd.s[i].alive)
            tok_ids_push(out, wd.s[i].id);
    if (out->oom) {
        rc = -12;
        goto out;
    }
    const int32_t *ids = out->p ? out->p + start : NULL; /* a word of no ids: p may be NULL */
    if (cacheable)
        cache_put(s, w, n, h, ids, out->n - start);
    else if (shared && out->n - start <= GC_IDS)
        gc_put(t->gcache, w, n, h, ids, out->n - start);
out:
    kwk_free(wd.s);
    return rc;
}
