/* vocab.c - a vocabulary's token bytes as a trie (kwk_grammar_vocab: immutable once built, any
 * thread). The trie is an array in depth-first preorder, so a mask (matcher.c) is one forward
 * pass that skips the subtrees no stack can enter. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

int kv_utf8_next(int q, unsigned b)
{
    int cont = b >= 0x80 && b <= 0xBF;
    switch (q) {
    case KV_U8_START:
        if (b < 0x80)
            return KV_U8_START;
        if (b >= 0xC2 && b <= 0xDF)
            return KV_U8_CONT1;
        if (b == 0xE0 || b == 0xED)
            return b == 0xE0 ? KV_U8_E0 : KV_U8_ED;
        if (b >= 0xE1 && b <= 0xEF)
            return KV_U8_CONT2;
        if (b == 0xF0 || b == 0xF4)
            return b == 0xF0 ? KV_U8_F0 : KV_U8_F4;
        if (b >= 0xF1 && b <= 0xF3)
            return KV_U8_CONT3;
        return KV_U8_BAD;
    case KV_U8_CONT1: return cont ? KV_U8_START : KV_U8_BAD;
    case KV_U8_CONT2: return cont ? KV_U8_CONT1 : KV_U8_BAD;
    case KV_U8_CONT3: return cont ? KV_U8_CONT2 : KV_U8_BAD;
    case KV_U8_E0: return b >= 0xA0 && b <= 0xBF ? KV_U8_CONT1 : KV_U8_BAD; /* no overlongs */
    case KV_U8_ED: return b >= 0x80 && b <= 0x9F ? KV_U8_CONT1 : KV_U8_BAD; /* no surrogates */
    case KV_U8_F0: return b >= 0x90 && b <= 0xBF ? KV_U8_CONT2 : KV_U8_BAD;
    case KV_U8_F4: return b >= 0x80 && b <= 0x8F ? KV_U8_CONT2 : KV_U8_BAD; /* <= U+10FFFF */
    default: return KV_U8_BAD;
    }
}

/* Per node, which decoder states its subtree reads validly from (bit q): the node's byte must
 * be valid there, and every child's subtree from the state after it. Children first. */
static int trie_utf8(struct kwk_grammar_vocab *v)
{
    uint16_t *ok = kwk_calloc(v->n_nodes ? v->n_nodes : 1, sizeof *ok);
    if (!ok)
        return -ENOMEM;
    for (uint32_t i = v->n_nodes; i-- > 0;) {
        for (int q = 0; q < KV_U8_STATES; q++) {
            int r = kv_utf8_next(q, v->nodes[i].byte), good = r != KV_U8_BAD;
            for (uint32_t j = i + 1; good && j < v->nodes[i].end; j = v->nodes[j].end)
                good = ok[j] >> r & 1;
            ok[i] |= (uint16_t)(good << q);
        }
        v->nodes[i].utf8 = ok[i] & 1;
    }
    kwk_free(ok);
    return 0;
}

static int tok_cmp(const void *a, const void *b, void *ctx)
{
    const struct kwk_grammar_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t nx = v->off[x + 1] - v->off[x], ny = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], KWK_MIN(nx, ny));
    if (c)
        return c;
    if (nx != ny)
        return nx < ny ? -1 : 1;
    return x < y ? -1 : x > y; /* equal bytes: by id, so the order is total */
}

static int nodes_push(struct kwk_grammar_vocab *v, size_t *cap, struct kv_node nd)
{
    if (v->n_nodes == *cap) {
        size_t c = *cap ? *cap * 2 : 1024, bytes;
        if (kwk_mul_size(c, sizeof *v->nodes, &bytes))
            return -ENOMEM;
        struct kv_node *p = kwk_realloc(v->nodes, bytes);
        if (!p)
            return -ENOMEM;
        v->nodes = p;
        *cap = c;
    }
    v->nodes[v->n_nodes++] = nd;
    return 0;
}

/* The trie of the usable tokens: sorted by their bytes, each token adds the nodes past its
 * common prefix with the one before; a node's subtree ends where the next token leaves it. */
static int trie_build(struct kwk_grammar_vocab *v)
{
    int32_t *order = kwk_calloc((size_t)v->n_vocab + 1, sizeof *order);
    uint32_t *path = kwk_calloc((size_t)v->max_len + 1, sizeof *path);
    size_t cap = 0;
    int32_t n = 0, prev = -1;
    int rc = -ENOMEM;
    if (!order || !path)
        goto out;
    for (int32_t i = 0; i < v->n_vocab; i++)
        if (v->usable[i])
            order[n++] = i;
    qsort_r(order, (size_t)n, sizeof *order, tok_cmp, v);
    v->node_toks = order; /* each token joins the trie in this order */
    v->n_node_toks = (uint32_t)n;
    order = NULL;
    size_t prev_len = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t t = v->node_toks[k];
        const char *s = v->bytes + v->off[t];
        size_t len = v->off[t + 1] - v->off[t], lcp = 0;
        if (prev >= 0) {
            const char *p = v->bytes + v->off[prev];
            while (lcp < len && lcp < prev_len && s[lcp] == p[lcp])
                lcp++;
        }
        for (size_t d = prev_len; d > lcp; d--)
            v->nodes[path[d]].end = v->n_nodes;
        for (size_t d = lcp + 1; d <= len; d++) {
            path[d] = v->n_nodes;
            struct kv_node nd = {0, (uint32_t)k, (uint16_t)d, (uint8_t)s[d - 1], 0};
            if (nodes_push(v, &cap, nd))
                goto out;
        }
        prev = t;
        prev_len = len;
    }
    for (size_t d = prev_len; d > 0; d--)
        v->nodes[path[d]].end = v->n_nodes;
    struct kv_node sentinel = {v->n_nodes + 1, (uint32_t)n, 0, 0, 0};
    if (nodes_push(v, &cap, sentinel))
        goto out;
    v->n_nodes--; /* the sentinel is not a node */
    v->sub = kwk_calloc(v->n_nodes ? v->n_nodes : 1, sizeof *v->sub);
    if (!v->sub)
        goto out;
    /* Children come after their parent: from the end, each node adds its children's bytes. */
    for (uint32_t i = v->n_nodes; i-- > 0;) {
        unsigned b = v->nodes[i].byte >= 0x80 ? 0 : v->nodes[i].byte < 2 ? 1 : v->nodes[i].byte;
        v->sub[i][b >> 6] |= 1ull << (b & 63);
        for (uint32_t j = i + 1; j < v->nodes[i].end; j = v->nodes[j].end) {
            v->sub[i][0] |= v->sub[j][0];
            v->sub[i][1] |= v->sub[j][1];
        }
    }
    rc = trie_utf8(v);
out:
    kwk_free(order);
    kwk_free(path);
    return rc;
}

void kwk_grammar_vocab_free(kwk_grammar_vocab *v)
{
    if (!v)
        return;
    kwk_free(v->bytes);
    kwk_free(v->off);
    kwk_free(v->usable);
    kwk_free(v->nodes);
    kwk_free(v->sub);
    kwk_free(v->node_toks);
    kwk_free(v);
}

/* The vocabulary of bytes[i][0 .. lens[i]); held[i] (NULL: none) marks tokens whose bytes are
 * kept but which the trie leaves out (special tokens: usable only where a matcher preserves
 * them). */
static kwk_grammar_vocab *vocab_build(const char *const *bytes, const uint32_t *lens,
                                      const uint8_t *held, int32_t n, struct kwk_err *err)
{
    kwk_grammar_vocab *v = NULL;
    size_t total = 0;
    int rc = 0;
    kwk_err_clear(err);
    if (n < 0 || (n && (!bytes || !lens))) {
        kwk_err_set(err, KWK_EARG, "grammar vocab: bad arguments");
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) {
        if (!bytes[i])
            continue;
        if (lens[i] > KV_TOKEN_BYTES_MAX) {
            kwk_err_set(err, KWK_ELIMIT, "grammar vocab: token %d has %u bytes, over %d", i,
                        lens[i], KV_TOKEN_BYTES_MAX);
            return NULL;
        }
        total += lens[i];
    }
    if (total >= UINT32_MAX) {
        kwk_err_set(err, KWK_ELIMIT, "grammar vocab: over 4 GiB of token bytes");
        return NULL;
    }
    v = kwk_calloc(1, sizeof *v);
    if (!v)
        goto nomem;
    v->n_vocab = n;
    v->bytes = kwk_malloc(total ? total : 1);
    v->off = kwk_calloc((size_t)n + 1, sizeof *v->off);
    v->usable = kwk_calloc(n ? (size_t)n : 1, 1);
    if (!v->bytes || !v->off || !v->usable)
        goto nomem;
    for (int32_t i = 0; i < n; i++) {
        size_t len = bytes[i] ? lens[i] : 0;
        if (len)
            memcpy(v->bytes + v->off[i], bytes[i], len);
        v->off[i + 1] = v->off[i] + len;
        v->usable[i] = len > 0 && !(held && held[i]);
        /* a held token's bytes count too: a lazy grammar's trigger buffer takes a token */
        v->max_len = KWK_MAX(v->max_len, (uint32_t)len);
    }
    rc = trie_build(v);
    if (rc)
        goto nomem;
    return v;
nomem:
    kwk_grammar_vocab_free(v);
    kwk_err_set(err, -ENOMEM, "grammar vocab: out of memory");
    return NULL;
}

kwk_grammar_vocab *kwk_grammar_vocab_from_bytes(const char *const *bytes, const uint32_t *lens,
                                                int32_t n, struct kwk_err *err)
{
    return vocab_build(bytes, lens, NULL, n, err);
}

kwk_grammar_vocab *kwk_grammar_vocab_new(const kwk_tokenizer *tok, struct kwk_err *err)
{
    kwk_grammar_vocab *v = NULL;
    int32_t n = tok ? kwk_tokenizer_n_vocab(tok) : -1;
    char *blob = NULL;
    const char **ptrs = NULL;
    size_t *offs = NULL; /* where each token's bytes start in blob, which may still move */
    uint32_t *lens = NULL;
    uint8_t *special = NULL; /* [n] kept out of the trie (kwk_matcher_preserve) */
    size_t used = 0, cap = 0;
    kwk_err_clear(err);
    if (n < 0) {
        kwk_err_set(err, KWK_EARG, "grammar vocab: no tokenizer");
        return NULL;
    }
    lens = kwk_calloc(n ? (size_t)n : 1, sizeof *lens);
    ptrs = kwk_calloc(n ? (size_t)n : 1, sizeof *ptrs);
    offs = kwk_calloc(n ? (size_t)n : 1, sizeof *offs);
    special = kwk_calloc(n ? (size_t)n : 1, 1);
    if (!lens || !ptrs || !offs || !special)
        goto nomem;
    for (int32_t i = 0; i < n; i++) {
        size_t len = 0;
        special[i] = (uint8_t)(kwk_tokenizer_is_special(tok, i) == 1);
        int rc = kwk_tokenizer_token_bytes(tok, i, blob ? blob + used : NULL, cap - used, &len);
        if (rc == KWK_ELIMIT && special[i] && len > KV_TOKEN_BYTES_MAX)
            continue; /* a special token that long is never preserved: as before, no bytes */
        if (rc == KWK_ELIMIT) {
            if (len > KV_TOKEN_BYTES_MAX) {
                kwk_err_set(err, KWK_ELIMIT, "grammar vocab: token %d has %zu bytes, over %d",
                            i, len, KV_TOKEN_BYTES_MAX);
                goto fail;
            }
            size_t c = cap ? cap : 4096;
            while (c - used < len)
                c *= 2;
            char *b = kwk_realloc(blob, c);
            if (!b)
                goto nomem;
            blob = b;
            cap = c;
            rc = kwk_tokenizer_token_bytes(tok, i, blob + used, cap - used, &len);
        }
        if (rc == KWK_ERANGE || (rc && rc != -ENOMEM && special[i]))
            continue; /* a hole; a special token without bytes (never preserved) */
        if (rc) {
            kwk_err_set(err, rc, "grammar vocab: the bytes of token %d: %s", i,
                        kwk_status_str(rc));
            goto fail;
        }
        lens[i] = (uint32_t)len;
        offs[i] = used;
        used += len;
    }
    for (int32_t i = 0; i < n; i++)
        ptrs[i] = lens[i] ? blob + offs[i] : NULL;
    v = vocab_build(ptrs, lens, special, n, err);
    goto done;
nomem:
    kwk_err_set(err, -ENOMEM, "grammar vocab: out of memory");
fail:
    v = NULL;
done:
    kwk_free(blob);
    kwk_free(ptrs);
    kwk_free(offs);
    kwk_free(lens);
    kwk_free(special);
    return v;
}

int32_t kwk_grammar_vocab_size(const kwk_grammar_vocab *v)
{
    return v ? v->n_vocab : 0;
}
