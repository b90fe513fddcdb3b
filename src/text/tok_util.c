/* tok_util.c - growable buffers, id vectors and the open-addressing hash maps the tokenizer
 * uses (vocabulary, merges, word cache). Any thread; maps are read-only after load. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

void tok_buf_reserve(struct tok_buf *b, size_t extra)
{
    size_t need;
    if (b->oom || kwk_add_size(b->n, extra, &need) || kwk_add_size(need, 1, &need)) {
        b->oom = 1;
        return;
    }
    if (need <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            b->oom = 1;
            return;
        }
        cap *= 2;
    }
    char *p = kwk_realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

void tok_buf_add(struct tok_buf *b, const void *s, size_t n)
{
    tok_buf_reserve(b, n);
    if (b->oom)
        return;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void tok_buf_addc(struct tok_buf *b, char c)
{
    if (b->n + 1 < b->cap && !b->oom) {
        b->p[b->n++] = c;
        b->p[b->n] = 0;
        return;
    }
    tok_buf_add(b, &c, 1);
}

void tok_buf_add_cp(struct tok_buf *b, uint32_t cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    tok_buf_add(b, u, n);
}

void tok_buf_free(struct tok_buf *b)
{
    kwk_free(b->p);
    memset(b, 0, sizeof *b);
}

void tok_ids_push(struct tok_ids *v, int32_t id)
{
    if (v->oom)
        return;
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64, bytes;
        if (kwk_mul_size(cap, sizeof *v->p, &bytes)) {
            v->oom = 1;
            return;
        }
        int32_t *p = kwk_realloc(v->p, bytes);
        if (!p) {
            v->oom = 1;
            return;
        }
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = id;
}

void tok_ids_free(struct tok_ids *v)
{
    kwk_free(v->p);
    memset(v, 0, sizeof *v);
}

/* FNV-1a mixed with a final avalanche: short keys (tokens) dominate, so simplicity wins. */
uint64_t tok_hash(const void *p, size_t n)
{
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

int tok_map_init(struct tok_map *m, size_t expected)
{
    size_t cap = pow2_at_least(expected * 2 + 1);
    m->slots = kwk_calloc(cap, sizeof *m->slots);
    if (!m->slots)
        return -ENOMEM;
    m->mask = cap - 1;
    m->n = 0;
    return 0;
}

static struct tok_map_slot *map_find(const struct tok_map *m, const char *key, size_t len,
                                     uint64_t h)
{
    size_t i = h & m->mask;
    for (;;) {
        struct tok_map_slot *s = &m->slots[i];
        if (!s->key)
            return s;
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len))
            return s;
        i = (i + 1) & m->mask;
    }
}

static int map_grow(struct tok_map *m)
{
    struct tok_map old = *m;
    if (tok_map_init(m, (old.mask + 1)))
        return -ENOMEM;
    for (size_t i = 0; i <= old.mask; i++)
        if (old.slots[i].key) {
            struct tok_map_slot *s = map_find(m, old.slots[i].key, old.slots[i].len,
                                              old.slots[i].hash);
            *s = old.slots[i];
            m->n++;
        }
    kwk_free(old.slots);
    return 0;
}

int tok_map_put(struct tok_map *m, const char *key, size_t len, int32_t val)
{
    if (!m->slots && tok_map_init(m, 16))
        return -ENOMEM;
    if ((m->n + 1) * 2 > m->mask + 1 && map_grow(m))
        return -ENOMEM;
    uint64_t h = tok_hash(key, len);
    struct tok_map_slot *s = map_find(m, key, len, h);
    if (!s->key) {
        s->key = key ? key : "";
        s->len = (uint32_t)len;
        s->hash = h;
        m->n++;
    }
    s->val = val;
    return 0;
}

int32_t tok_map_get(const struct tok_map *m, const char *key, size_t len)
{
    if (!m->slots)
        return -1;
    const struct tok_map_slot *s = map_find(m, key, len, tok_hash(key, len));
    return s->key ? s->val : -1;
}

void tok_map_free(struct tok_map *m)
{
    kwk_free(m->slots);
    memset(m, 0, sizeof *m);
}

static uint64_t pair_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

int tok_pairmap_init(struct tok_pairmap *m, size_t expected)
{
    size_t cap = pow2_at_least(expected * 2 + 1);
    m->slots = kwk_malloc(cap * sizeof *m->slots);
    if (!m->slots)
        return -ENOMEM;
    for (size_t i = 0; i < cap; i++)
        m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
    m->n = 0;
    return 0;
}

static struct tok_pair_slot *pair_find(const struct tok_pairmap *m, uint64_t key)
{
    size_t i = pair_hash(key) & m->mask;
    while (m->slots[i].key != UINT64_MAX && m->slots[i].key != key)
        i = (i + 1) & m->mask;
    return &m->slots[i];
}

int tok_pairmap_put(struct tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    if (!m->slots && tok_pairmap_init(m, 1024))
        return -ENOMEM;
    if ((m->n + 1) * 2 > m->mask + 1) {
        struct tok_pairmap old = *m;
        if (tok_pairmap_init(m, old.mask + 1))
            return -ENOMEM;
        for (size_t i = 0; i <= old.mask; i++)
            if (old.slots[i].key != UINT64_MAX) {
                *pair_find(m, old.slots[i].key) = old.slots[i];
                m->n++;
            }
        kwk_free(old.slots);
    }
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    struct tok_pair_slot *s = pair_find(m, key);
    if (s->key == UINT64_MAX)
        m->n++;
    s->key = key;
    s->rank = rank;
    s->id = id;
    return 0;
}

const struct tok_pair_slot *tok_pairmap_get(const struct tok_pairmap *m, int32_t a, int32_t b)
{
    if (!m->slots)
        return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    const struct tok_pair_slot *s = pair_find(m, key);
    return s->key == key ? s : NULL;
}

void tok_pairmap_free(struct tok_pairmap *m)
{
    kwk_free(m->slots);
    memset(m, 0, sizeof *m);
}
