/* attn.h - causal attention over a KV cache for a range of (row, head) items, one table per
 * instruction set (attn_ref.c is the specification; avx2_attn.c, avx512_attn.c agree with it to
 * float rounding). Pure functions of their arguments: any thread may call them concurrently. */
#ifndef KWK_ATTN_H
#define KWK_ATTN_H

#include <stddef.h>
#include <stdint.h>

/* One layer of one chunk. Item i is (row i / n_heads, query head i % n_heads); query head h reads
 * kv head h / (n_heads / n_kv_heads). Everything is borrowed; nothing is written but out. */
struct kwk_attn_args {
    int head_dim, n_heads, n_kv_heads; /* n_heads % n_kv_heads == 0 */
    long ld_pos, ld_head;              /* elements between a cache's positions, its kv heads:
                                          the decoder's caches are head-major (ld_pos =
                                          head_dim), so a decode step reads each head's keys
                                          and values as one run, not one page apart each */
    float scale;                       /* 1 / sqrt(head_dim) */
    const float *q;                    /* q[row * ldq + h * head_dim + e]: rotated queries */
    long ldq;
    float *out;                        /* out[row * ldo + h * head_dim + e] */
    long ldo;
    /* The cache's elements: float, or IEEE half (uint16_t bits; 16-bit caches halve what a decode
     * step reads). Keys and values are widened exactly, so a half cache gives bitwise the numbers
     * of a float cache that holds the same values. */
    int kv_half;
    /* Or the chunk's keys and values staged by the table's stage_bf16 (kv_half 0): keys rounded
     * to bf16, values rounded and interleaved in pairs of positions. Only for a table with
     * stage_bf16, head_dim % 32 == 0, ld_pos == head_dim and every row's first even (the pairs
     * start on even positions); the same outputs, bitwise, as over the cache it was staged from. */
    int kv_bf16;
    /* Or, with kv_half: the keys (k_bf16), the values (v_bf16) are the table's half_to_bf16 of
     * a half cache, bf16 already, and read as they are (with kv_bf16, k_rows point at such keys
     * and the values are staged). Only for a table with half_to_bf16 and head_dim % 32 == 0; the
     * same outputs, bitwise, as over the half cache. */
    int k_bf16, v_bf16;
    const void *const *k_rows;         /* [n_rows] the row's slot's K cache for this layer: key
                                          position p, kv head g at element p*ld_pos + g*ld_head */
    const void *const *v_rows;         /* [n_rows] the same for V */
    const int *first, *last;           /* [n_rows] attended positions first..last (inclusive):
                                          causal (last = row's position), sliding window (first) */
    /* kwk_attn_split's shares: whole kv groups even where there are few (a decode step) rather
     * than single heads. Set from the table's whole_groups (kwk_attn_kernel). */
    int whole_groups;
};

struct kwk_attn_kernel {
    const char *name;
    /* Attention of items [i0, i1): out = softmax(q . k_p * scale over p in first..last) . v.
     * scratch: at least kwk_attn_scratch_floats(a, max_pos) floats, owned by the calling thread,
     * where max_pos bounds last - first + 1 of every row. A row with last < first gets zeros.
     * Batch invariance: an item's output is bitwise the same whatever range [i0, i1) it is
     * computed in (alone, with its row's other heads, with other rows, any thread split), within
     * one table: ranges only share loads, never change an item's order of operations.
     * Does not allocate, lock or fail. */
    void (*items)(const struct kwk_attn_args *a, long i0, long i1, float *scratch);
    /* NULL, or (the bf16 table) the staging kv_bf16 reads: positions [p0, p1) of one kv head's
     * run of a cache (position p at element p * head_dim; floats if half is 0, IEEE halves if 1,
     * half_to_bf16's output if 2), p0 even, head_dim % 32 == 0: keys rounded to bf16 into
     * kb[p * head_dim + e] (kb NULL: none; it must be NULL for half 2, whose keys the tiles read
     * in the cache, kwk_attn_args.k_bf16), values rounded
     * into pairs vp[(p & ~1) * head_dim + 2e + (p & 1)], the slot of position p1 when p1 is odd
     * zero. A prompt chunk's tiles each re-round the keys and values they read; staged once, the
     * tiles read them as they are. */
    void (*stage_bf16)(int half, const void *k, const void *v, uint16_t *kb, uint16_t *vp,
                       long p0, long p1, int head_dim);
    /* NULL, or (the bf16 table) n halves of a key or value, as a decoder stores them, rounded
     * to bf16 as its tiles round a half cache's elements, into dst (may be src): a cache of these
     * is read with kwk_attn_args.k_bf16 / v_bf16, and no tile rounds them again (about a third
     * of a generation step's attention at 500 positions). */
    void (*half_to_bf16)(uint16_t *dst, const uint16_t *src, long n);
    /* n > 0: for head sizes a multiple of n, a tile costs about the same for 1 and for 16
     * queries of a kv group (the AMX table, n = 32: its multiplies always hold 16 query rows), so
     * a decode step's items are best shared out by whole kv groups (kwk_attn_args.whole_groups):
     * splitting a group between threads reads its keys and values twice and saves a thread no
     * multiplies. 0 (and other head sizes, which such a table runs on float tiles): a tile's cost
     * grows with its queries, and single heads balance the threads better. Read it through
     * kwk_attn_whole_groups. */
    int whole_groups;
    /* n > 0: the same for head sizes a multiple of n, but only where a generated token's weights
     * are larger than the last-level cache (the bf16 vector table, whose cost grows with its
     * queries). There each step's keys and values come from DRAM behind the weights,
     * so a group split between threads costs its bytes twice, and the thread left without a group
     * reads the next product ahead (prefetch_next in forward.c). Read it through
     * kwk_attn_whole_groups_for. */
    int whole_groups_past_llc;
    /* 0, or (the AMX table, for head sizes its whole_groups takes) the positions of a span: the
     * table's softmax runs over a row's positions in spans of this many from its first, each
     * with its own max, sum and weighted values, merged in order. So a long row's spans can be
     * computed by different threads (span_part for each kv group and span, then span_merge once
     * all the row's parts are done) and give bitwise the outputs its items give: a decode step
     * with fewer kv groups than threads, or not a multiple of them, is shared by positions
     * (flash-decoding's split) and stays batch invariant. Read it through kwk_attn_span. */
    int span;
    /* Span s of kv group g of row row: its parts (for each of the group's query heads: the
     * span's max, its sum, its head_dim weighted values) into parts, the row's
     * kwk_attn_parts_floats, at the group's and span's place. scratch as items'. Any thread;
     * different (g, s) write different floats. */
    void (*span_part)(const struct kwk_attn_args *a, int row, int g, int s, float *parts,
                      float *scratch);
    /* Query heads [h0, h1) of row row: the parts of all its groups' spans merged into out. */
    void (*span_merge)(const struct kwk_attn_args *a, int row, int h0, int h1,
                       const float *parts);
};

/* Table k's span for heads of head_dim elements (its span where kwk_attn_whole_groups, else 0). */
int kwk_attn_span(const struct kwk_attn_kernel *k, int head_dim);
/* Floats of span parts of one row attending at most max_pos positions. */
size_t kwk_attn_parts_floats(const struct kwk_attn_args *a, int span, int max_pos);
/* Thread ith's share [*u0, *u1) of a row's span units (kv group g, span s as unit g * n_spans +
 * s, n_spans = ceil(n / span) for its n positions), contiguous and balanced by positions. */
void kwk_attn_span_split(const struct kwk_attn_args *a, int row, int span, int ith, int nth,
                         long *u0, long *u1);

/* Whether table k wants a decode step of heads of head_dim elements shared by whole kv groups
 * (its whole_groups, above): the value for kwk_attn_args.whole_groups. */
int kwk_attn_whole_groups(const struct kwk_attn_kernel *k, int head_dim);
/* The same for a decoder whose generated token reads token_bytes of weights (0: not known):
 * kwk_attn_whole_groups, or the table's whole_groups_past_llc where those bytes exceed the
 * last-level cache (kwk_cpu_past_llc). */
int kwk_attn_whole_groups_for(const struct kwk_attn_kernel *k, int head_dim, double token_bytes);

/* Queries (row, head) whose scores a table may hold at once: a prompt chunk's neighbouring rows
 * read the same keys and values, so a table shares those loads across their heads. */
#define KWK_ATTN_TILE_QUERIES 16
/* Query heads of one kv group in a tile at most. */
#define KWK_ATTN_TILE_HEADS 8

/* Computes one tile: query heads h0 .. h0+nh-1 (of one kv group) of rows row0 .. row0+nr-1,
 * rows that read the same keys (one slot, one first position, at least one position each, last
 * non-decreasing); nr * nh <= KWK_ATTN_TILE_QUERIES when nr > 1. */
typedef void (*kwk_attn_tile_fn)(const struct kwk_attn_args *a, int row0, int nr, int h0, int nh,
                                 float *scratch);

/* The SIMD tables' items(): items [i0, i1) cut into tiles for run. Whole rows go a kv group at a
 * time over up to KWK_ATTN_TILE_QUERIES / heads neighbouring rows that read the same keys; a
 * share's partial first or last row goes kv group by group; rows that attend nothing get zeros.
 * Which tile an item lands in never changes its numbers (run's contract, as items'). */
void kwk_attn_tiles(const struct kwk_attn_args *a, long i0, long i1, kwk_attn_tile_fn run,
                    float *scratch);

/* Floats of scratch one thread needs for rows attending at most max_pos positions: the scores of
 * KWK_ATTN_TILE_QUERIES queries (or of one kv group's query heads, if more), each padded to a
 * multiple of 16, those queries transposed (KWK_ATTN_TILE_QUERIES * head_dim), a block of 16
 * keys widened from half (16 * head_dim), the bf16 table's values of one key range
 * interleaved (max(4096, 8 * head_dim)), the AMX table's second form of 16 queries' weights
 * (16 * max_pos, padded as the scores) and its values of a span (16 * head_dim). Same for every
 * table. */
size_t kwk_attn_scratch_floats(const struct kwk_attn_args *a, int max_pos);

/* Thread ith's share [*i0, *i1) of the n_rows * n_heads items, balanced by work (positions
 * attended) rather than by count: a prompt chunk's last rows attend many more positions than its
 * first. Shares are whole kv groups (which share loads), or single heads when there are fewer
 * than 4 groups per thread (a decode step) and a->whole_groups is 0. Deterministic; reads only
 * a->first, a->last, a->whole_groups and the head counts.
 * Any split gives the same outputs (batch invariance), so this only moves time. Any thread. */
void kwk_attn_split(const struct kwk_attn_args *a, int n_rows, int ith, int nth, long *i0,
                    long *i1);

/* The table for an ISA (enum kwk_isa), clamped to what kwk_isa() allows, as kwk_kernels_for. */
const struct kwk_attn_kernel *kwk_attn_kernel_for(int isa);
/* The table for kwk_isa() (which honours KWKER_ISA): the same ISA as kwk_kernels(). */
const struct kwk_attn_kernel *kwk_attn_kernel(void);

/* The table of decoders whose matrices read 8-bit activations: kwk_attn_avx512_bf16 when
 * kwk_isa() is avx512 and the CPU has AVX512_BF16 (kwk_attn_amx_bf16 where kwk_cpu_amx_bf16()),
 * else kwk_attn_kernel(). */
const struct kwk_attn_kernel *kwk_attn_kernel_act8(void);

/* Per-ISA tables (attn_ref.c, avx2_attn.c, avx512_attn.c). */
extern const struct kwk_attn_kernel kwk_attn_ref;
extern const struct kwk_attn_kernel kwk_attn_avx2;
extern const struct kwk_attn_kernel kwk_attn_avx512;
/* AVX-512 with bf16 products (AVX512_BF16): queries, keys, weights and values rounded to
 * bfloat16, products summed in float; agrees with attention over those rounded numbers to float
 * rounding, and is batch invariant as the others. Only where kwk_cpu_bf16(). */
extern const struct kwk_attn_kernel kwk_attn_avx512_bf16;
/* The same rounding with the products on AMX-BF16 tile multiplies (amx_attn.c): agrees with
 * kwk_attn_avx512_bf16 to float rounding (its sums run in another order), batch invariant as
 * the others. No stage_bf16: it reads half_to_bf16's caches where they lie. Only where
 * kwk_cpu_amx_bf16(). */
extern const struct kwk_attn_kernel kwk_attn_amx_bf16;

#endif
