/* amx_bf16.c - preserve's products (bf16 weights, float activations) on AMX-BF16 (Intel Xeon
 * since Sapphire Rapids), every product exact. Pure functions; any thread (each call loads its
 * own tile configuration). Only called where kwk_cpu_amx_bf16(); the AVX-512 table calls it where
 * kwk_cpu_amx_preserve() (KWKER_AMX_PRESERVE=on: not the default, see base.h).
 *
 * Why the products are exact: tdpbf16ps multiplies bf16 by bf16 and sums in float. A float x is
 * the sum of three bf16 numbers: x1 = x rounded to bf16 (nearest even), x2 = x - x1 rounded, x3
 * = x - x1 - x2 (both differences exact in float; x3 has at most 8 significant bits). A bf16
 * weight times a bf16 number is exact in float (8 x 8 significant bits), so the three products
 * of w x1, w x2 and w x3 hold w x exactly. What differs from the vector tables' float32 FMA
 * chains is the order of the float sums: the same rounding error's size, not its bits (and
 * parts and products below float's normal range are flushed, as tdpbf16ps does).
 *
 * Layout: A is 16 weight rows x 32 columns read where they lie (the checkpoint's mapped rows,
 * no pack); B a 32-column chunk as 16 pairs x 16 columns, column 3j + s holding part s of token
 * j (5 tokens a tile, the 16th column zero); C 16 rows x those columns. A token's output is
 * (c0 + c1) + c2 of its three columns. Chunks start on the rows' 64-byte boundaries (struct
 * chunks): safetensors places a tensor at any 8-byte offset (the bench checkpoints' at 8 or 32
 * past a cache line), and a tile load whose 64-byte rows straddle cache lines reads two lines a
 * row: prompts 31% slower, decode 5% (docs/benchmarks.md, session 30). So where the rows lie
 * 64-byte multiples apart and are long (HEAD_MIN_COLS), chunk 0 holds the columns before the
 * first boundary (zero-padded in front), the rest are read aligned, and the last is padded as
 * before. Three columns for the parts rather than three multiplies into one column: a decode
 * step then takes one multiply per 16 x 32 weights, not three, and the tile unit does not fall
 * further behind memory (three multiplies: about 60% of the vector decode's bandwidth in a
 * first test; one: 75-90%, docs/benchmarks.md, session 28).
 *
 * A decode step (one token) does not use the tile unit: it computes the same sums bit for bit
 * with AVX-512 FMAs on vector loads ("a decode step on vector loads" below), which stream
 * faster.
 *
 * Batch invariance (kernels.h): a C element sums over all chunks in order, and each multiply's
 * sum depends only on the element's A row and B column, never on the tile's other rows and
 * columns or on which column holds the token; so a (row, token) gives the same bits alone (on
 * the vector engine), in a batch, in any row range. Each sum is one chain over the whole row: a
 * decode group of row blocks reads whole rows (passes over column slices, added in y, read
 * memory 10-28% slower), and a prompt's column blocks keep their C tiles in memory between
 * blocks, which a tile store and load do exactly. */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/base.h"
#include "kernels/amx_bf16.h"
#include "kernels/bf16_split.h"
#include "kernels/amx_tiles16.h" /* C tiles TC0-3: 2 row blocks x 2 token tiles, or 4 row blocks */

#define INLINE static inline __attribute__((always_inline))

#define CHUNK 32    /* columns a multiply takes: 16 pairs */
#define TILE_TOKS 5 /* tokens a B tile holds, three columns each */
/* A column block's staged activations, at most: they stay in L2 (2 MiB a core on the Xeon
 * measured) while every row block of the thread's rows reads them. Against 512 KiB (more
 * column blocks, more C tiles spilled): 1536 x 576 and 2048 x 8192 products 5-12% faster,
 * 2 MiB no better (bench_kernels, 512 tokens, session 28). */
#define STAGE_BYTES (1024u * 1024u)
/* B tiles a token block, at most (60 tokens): each weight comes from memory once a token
 * block, the rest of the block's tiles take it from cache. */
#define MAX_TILES 12

/* A chunk's B operand: [pair][column], each element two bf16 (column 3j + s: part s of token
 * j's elements 2 * pair and 2 * pair + 1). */
typedef uint32_t btile[16][16];

/* Lanes i of 16 (32) elements from column k that lie in [0, cols): k is negative in a head
 * chunk. */
INLINE __mmask16 cols16(int64_t k, int64_t cols)
{
    return (__mmask16)(lanes16(cols - k) & ~lanes16(-k));
}

INLINE __mmask32 cols32(int64_t k, int64_t cols)
{
    return (__mmask32)(lanes32(cols - k) & ~lanes32(-k));
}

/* p moved by n bytes, n negative for a head chunk: its address may lie before the array, so it
 * is formed in integers; the lanes there are masked off and never read. */
INLINE const void *moved(const void *p, int64_t n)
{
    return (const void *)((uintptr_t)p + (uintptr_t)n);
}

/* How a matrix's columns fall into chunks: chunk c holds columns [32c - lead, 32c - lead + 32),
 * so that chunks from 1 start on a 64-byte boundary of every row. Only where the rows lie a
 * multiple of 64 bytes apart (cols a multiple of 32) do all rows share one boundary; otherwise
 * lead is 0, the layout of an aligned matrix. Chunks [lo, hi) lie wholly inside the rows and are
 * read where they lie; the head (lead > 0) and a tail are copied, zero-padded. The sums run over
 * chunks in order, so a matrix's numbers depend on where it lies (as on which table runs it),
 * never on the batch, the row range or the thread. */
struct chunks {
    int64_t lead, nk, lo, hi;
};

/* Rows shorter than this keep lead 0 wherever they lie: a head and a tail are two copied chunks
 * a row group, and a tile load of a fresh copy waits for its stores; on short rows that costs a
 * decode step more than the aligned reads save (in-model, session 30: SmolLM2-135M's 576 and
 * 1536 columns 8% slower decode, 360M's 960 and 2560 3%; SmolLM2-1.7B's 2048 and 8192 8% faster
 * decode and 28% faster prompts). */
#define HEAD_MIN_COLS 2048
static int64_t head_min_cols = HEAD_MIN_COLS; /* kwk_bf16_amx_test_head_cols */

static struct chunks chunks_of(const struct kwk_mat *w)
{
    uintptr_t mis = (uintptr_t)w->data & 63;
    int head = w->cols >= head_min_cols && w->cols % CHUNK == 0 && mis % 2 == 0;
    int64_t lead = head ? (int64_t)(mis / 2) : 0;
    return (struct chunks){.lead = lead,
                           .nk = (w->cols + lead + CHUNK - 1) / CHUNK,
                           .lo = lead > 0,
                           .hi = (w->cols + lead) / CHUNK};
}

/* r[i][j] <-> r[j][i] for 16 x 16 32-bit elements: within pairs of rows, then pairs of pairs,
 * then 128-bit lanes. */
INLINE void transpose16(__m512i r[16])
{
    __m512i t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* r[4i + q] (q = 0..3): element q of each 128-bit lane L of rows 4i..4i+3, i.e. column
     * 4L + q of those rows */
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        __m512i v = _mm512_shuffle_i32x4(r[q], r[4 + q], _MM_SHUFFLE(2, 0, 2, 0));
        __m512i w = _mm512_shuffle_i32x4(r[q], r[4 + q], _MM_SHUFFLE(3, 1, 3, 1));
        __m512i v2 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], _MM_SHUFFLE(2, 0, 2, 0));
        __m512i w2 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], _MM_SHUFFLE(3, 1, 3, 1));
        t[q] = _mm512_shuffle_i32x4(v, v2, _MM_SHUFFLE(2, 0, 2, 0));
        t[4 + q] = _mm512_shuffle_i32x4(w, w2, _MM_SHUFFLE(2, 0, 2, 0));
        t[8 + q] = _mm512_shuffle_i32x4(v, v2, _MM_SHUFFLE(3, 1, 3, 1));
        t[12 + q] = _mm512_shuffle_i32x4(w, w2, _MM_SHUFFLE(3, 1, 3, 1));
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        r[i] = t[i];
}

/* Chunks [c0, c1) (columns from 32c - lead) of the B tile of tokens x[0 .. nt) (nt <= 5, rows
 * cols apart) into dst[0 .. c1 - c0); columns past the tokens' and elements outside [0, cols)
 * zero. */
static void stage_tile(const float *x, int64_t cols, int64_t lead, int nt, int64_t c0, int64_t c1,
                       btile *dst)
{
    const __m512i idx = _mm512_load_si512(HIGH_HALVES);
    for (int64_t c = c0; c < c1; c++) {
        __m512i r[16];
        int64_t k = c * CHUNK - lead;
        __mmask16 mlo = cols16(k, cols), mhi = cols16(k + 16, cols);
        for (int j = 0; j < TILE_TOKS; j++) {
            if (j >= nt) {
                r[3 * j] = r[3 * j + 1] = r[3 * j + 2] = _mm512_setzero_si512();
                continue;
            }
            const float *row = x + (int64_t)j * cols;
            __m512 l1, l2, l3, h1, h2, h3;
            split3(_mm512_maskz_loadu_ps(mlo, moved(row, k * 4)), &l1, &l2, &l3);
            split3(_mm512_maskz_loadu_ps(mhi, moved(row, (k + 16) * 4)), &h1, &h2, &h3);
            r[3 * j] = pairs(l1, h1, idx);
            r[3 * j + 1] = pairs(l2, h2, idx);
            r[3 * j + 2] = pairs(l3, h3, idx);
        }
        r[15] = _mm512_setzero_si512();
        transpose16(r);
        for (int p = 0; p < 16; p++)
            _mm512_store_si512(dst[c - c0][p], r[p]);
    }
}

/* A for rows [rb, rb + nrows) and chunk c: where the rows lie, or for a partial row block, the
 * head or a partial last chunk (c outside [g->lo, g->hi)) a zero-padded copy in abuf. Returns
 * the rows' stride. */
INLINE const void *a_src(const struct kwk_mat *w, const struct chunks *g, int64_t rb, int nrows,
                         int64_t c, uint16_t (*abuf)[CHUNK], long *stride)
{
    int64_t k = c * CHUNK - g->lead; /* the chunk's first column */
    const uint16_t *rows = (const uint16_t *)w->data + rb * w->cols;
    if (nrows == 16 && c >= g->lo && c < g->hi) {
        *stride = (long)(w->cols * 2);
        return rows + k;
    }
    __mmask32 m = cols32(k, w->cols);
    for (int i = 0; i < 16; i++)
        _mm512_storeu_si512(abuf[i], i < nrows ? _mm512_maskz_loadu_epi16(
                                                     m, moved(rows + i * w->cols, k * 2))
                                                : _mm512_setzero_si512());
    /* GCC's tileloadd is an asm without a memory operand: the copy must be stored before it */
    __asm__ volatile("" ::: "memory");
    *stride = CHUNK * 2;
    return abuf;
}

/* C tile tc's 16 rows x 5 tokens into y: rows [rb, rb + nrows), tokens t .. t + nt - 1. */
#define PUT(tc, rb, nrows, t, nt)                                                                  \
    do {                                                                                           \
        _tile_stored(tc, cbuf, 64);                                                                \
        put(cbuf, y, ldy, rb, nrows, t, nt);                                                       \
    } while (0)

INLINE void put(float (*cbuf)[16], float *y, long ldy, int64_t rb, int nrows, int t, int nt)
{
    __m512i r[16];
    __asm__ volatile("" ::: "memory"); /* the tile store first */
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++)
        r[m] = _mm512_load_si512(cbuf[m]);
    transpose16(r); /* r[n]: column n over the 16 rows */
    __mmask16 m = lanes16(nrows);
    for (int j = 0; j < nt; j++) {
        __m512 s = _mm512_add_ps(_mm512_castsi512_ps(r[3 * j]), _mm512_castsi512_ps(r[3 * j + 1]));
        s = _mm512_add_ps(s, _mm512_castsi512_ps(r[3 * j + 2]));
        _mm512_mask_storeu_ps(y + (int64_t)(t + j) * ldy + rb, m, s);
    }
}

/* A prompt block's column block: chunks [c0, c1) of g->nk, staged B tiles st[tile][c - c0]
 * (width chunks each), and where C tiles wait
 * between column blocks (spill[row block][tile], 16 x 16 floats; unused with one column block:
 * a tile store and load is exact, so the sums go on as if never stopped). */
struct cblock {
    const struct kwk_mat *w;
    const struct chunks *g;
    int64_t c0, c1, width;
    const btile *st;
    float (*spill)[16][16];
    int tiles; /* spill's tiles a row block */
    float *y;
    long ldy;
};

/* C tile tc of row block i and tile j: zeroed at the first column block, else reloaded */
#define C_START(tc, i, j)                                                                          \
    do {                                                                                           \
        if (cb->c0 == 0)                                                                           \
            _tile_zero(tc);                                                                        \
        else                                                                                       \
            _tile_loadd(tc, cb->spill[(i) * cb->tiles + (j)], 64);                                 \
    } while (0)
/* ... and after the last column block into y (rows rb, tokens t), else kept */
#define C_END(tc, i, j, rb, nrows, t, nt)                                                          \
    do {                                                                                           \
        if (cb->c1 == cb->g->nk)                                                                   \
            PUT(tc, rb, nrows, t, nt);                                                             \
        else                                                                                       \
            _tile_stored(tc, cb->spill[(i) * cb->tiles + (j)], 64);                                \
    } while (0)

/* Row blocks i and i + 1 (rows rb: nr0 of them, rb + 16: nr1; RB = 1: the first only) x token
 * tiles j and j + 1 (tokens t .. t + nt0 - 1 and the next nt1; NT = 1: j only), over the column
 * block's chunks. */
INLINE void block(const struct cblock *cb, int64_t i, int j, int64_t rb, int nr0, int nr1, int t,
                  int nt0, int nt1, int RB, int NT)
{
    _Alignas(64) uint16_t abuf[2][16][CHUNK];
    _Alignas(64) float cbuf[16][16];
    float *y = cb->y;
    long ldy = cb->ldy;
    const btile *b0 = cb->st + (size_t)j * (size_t)cb->width, *b1 = b0 + cb->width;
    C_START(TC0, i, j);
    if (NT > 1)
        C_START(TC1, i, j + 1);
    if (RB > 1)
        C_START(TC2, i + 1, j);
    if (RB > 1 && NT > 1)
        C_START(TC3, i + 1, j + 1);
    for (int64_t c = cb->c0; c < cb->c1; c++) {
        long s0, s1;
        const void *a0 = a_src(cb->w, cb->g, rb, nr0, c, abuf[0], &s0);
        _tile_loadd(TA0, a0, s0);
        _tile_loadd(TB0, b0[c - cb->c0], 64);
        _tile_dpbf16ps(TC0, TA0, TB0);
        if (NT > 1) {
            _tile_loadd(TB1, b1[c - cb->c0], 64);
            _tile_dpbf16ps(TC1, TA0, TB1);
        }
        if (RB > 1) {
            const void *a1 = a_src(cb->w, cb->g, rb + 16, nr1, c, abuf[1], &s1);
            _tile_loadd(TA1, a1, s1);
            _tile_dpbf16ps(TC2, TA1, TB0);
            if (NT > 1)
                _tile_dpbf16ps(TC3, TA1, TB1);
        }
    }
    C_END(TC0, i, j, rb, nr0, t, nt0);
    if (NT > 1)
        C_END(TC1, i, j + 1, rb, nr0, t + TILE_TOKS, nt1);
    if (RB > 1)
        C_END(TC2, i + 1, j, rb + 16, nr1, t, nt0);
    if (RB > 1 && NT > 1)
        C_END(TC3, i + 1, j + 1, rb + 16, nr1, t + TILE_TOKS, nt1);
}

typedef void (*block_fn)(const struct cblock *, int64_t, int, int64_t, int, int, int, int, int);
#define BLOCK_FN(RB, NT)                                                                           \
    static void block_##RB##_##NT(const struct cblock *cb, int64_t i, int j, int64_t rb, int nr0,  \
                                  int nr1, int t, int nt0, int nt1)                                \
    {                                                                                              \
        block(cb, i, j, rb, nr0, nr1, t, nt0, nt1, RB, NT);                                        \
    }
BLOCK_FN(1, 1)
BLOCK_FN(1, 2)
BLOCK_FN(2, 1)
BLOCK_FN(2, 2)
static const block_fn BLOCKS[2][2] = {{block_1_1, block_1_2}, {block_2_1, block_2_2}};

/* G row blocks from rb (rows [rb, r1)) x one token tile over every chunk: a decode step's
 * shape. The B chunk is loaded once for the G multiplies. b NULL: each chunk is staged here from
 * x (nt tokens) as it is needed, the same numbers without a staging buffer. */
INLINE void group(const struct kwk_mat *w, const struct chunks *g, const btile *b, const float *x,
                  int nt, int64_t rb, int64_t r1, float *y, long ldy, int t, int G)
{
    _Alignas(64) uint16_t abuf[2][16][CHUNK];
    _Alignas(64) float cbuf[16][16];
    _Alignas(64) btile one[1];
    int nr[4];
    for (int i = 0; i < 4; i++)
        nr[i] = (int)KWK_MIN(16, r1 - rb - 16 * i);
    _tile_zero(TC0);
    if (G > 1)
        _tile_zero(TC1);
    if (G > 2)
        _tile_zero(TC2);
    if (G > 3)
        _tile_zero(TC3);
    for (int64_t c = 0; c < g->nk; c++) {
        long s;
        if (b) {
            _tile_loadd(TB0, b[c], 64);
        } else {
            stage_tile(x, w->cols, g->lead, nt, c, c + 1, one);
            __asm__ volatile("" ::: "memory");
            _tile_loadd(TB0, one[0], 64);
        }
        _tile_loadd(TA0, a_src(w, g, rb, nr[0], c, abuf[0], &s), s);
        _tile_dpbf16ps(TC0, TA0, TB0);
        if (G > 1) {
            _tile_loadd(TA1, a_src(w, g, rb + 16, nr[1], c, abuf[1], &s), s);
            _tile_dpbf16ps(TC1, TA1, TB0);
        }
        if (G > 2) {
            _tile_loadd(TA0, a_src(w, g, rb + 32, nr[2], c, abuf[0], &s), s);
            _tile_dpbf16ps(TC2, TA0, TB0);
        }
        if (G > 3) {
            _tile_loadd(TA1, a_src(w, g, rb + 48, nr[3], c, abuf[1], &s), s);
            _tile_dpbf16ps(TC3, TA1, TB0);
        }
    }
    PUT(TC0, rb, nr[0], t, nt);
    if (G > 1)
        PUT(TC1, rb + 16, nr[1], t, nt);
    if (G > 2)
        PUT(TC2, rb + 32, nr[2], t, nt);
    if (G > 3)
        PUT(TC3, rb + 48, nr[3], t, nt);
}

typedef void (*group_fn)(const struct kwk_mat *, const struct chunks *, const btile *,
                         const float *, int, int64_t, int64_t, float *, long, int);
#define GROUP_FN(G)                                                                                \
    static void group_##G(const struct kwk_mat *w, const struct chunks *g, const btile *b,         \
                          const float *x, int nt, int64_t rb, int64_t r1, float *y, long ldy,      \
                          int t)                                                                   \
    {                                                                                              \
        group(w, g, b, x, nt, rb, r1, y, ldy, t, G);                                               \
    }
GROUP_FN(1)
GROUP_FN(2)
GROUP_FN(3)
GROUP_FN(4)
static const group_fn GROUPS[5] = {NULL, group_1, group_2, group_3, group_4};

/* Row blocks a decode group takes: four keep the tile unit ahead of memory; with rows longer
 * than 4096 columns two (64 rows of 16 KiB at once read 25% slower from memory, session 28). */
static int group_blocks(int64_t cols)
{
    return cols > 4096 ? 2 : 4;
}

/* One token tile (b, tokens t .. t + nt - 1) over rows [r0, r1), in decode groups. */
static void tile_rows(const struct kwk_mat *w, const struct chunks *g, const btile *b,
                      const float *x, int nt, int64_t r0, int64_t r1, float *y, long ldy, int t)
{
    int G = group_blocks(w->cols);
    for (int64_t rb = r0; rb < r1; rb += 16 * G) {
        int n = (int)KWK_MIN(G, (r1 - rb + 15) / 16);
        GROUPS[n](w, g, b, x, nt, rb, r1, y, ldy, t);
    }
}

/* ---- the staging buffer: one a thread, grown as needed, freed when the thread ends */

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_keyed;
static __thread btile *scratch;
static __thread size_t scratch_tiles; /* chunks it holds */
static int no_scratch;                /* kwk_bf16_amx_test_no_scratch */

static void scratch_init(void)
{
    scratch_keyed = pthread_key_create(&scratch_key, free) == 0;
}

/* At least n chunks, or NULL (no memory, or no key to free it with): the caller then stages
 * chunk by chunk. */
static btile *stage_buffer(size_t n)
{
    if (no_scratch)
        return NULL;
    if (n <= scratch_tiles)
        return scratch;
    pthread_once(&scratch_once, scratch_init);
    if (!scratch_keyed)
        return NULL;
    size_t want = (n + 63) / 64 * 64; /* 64 KiB steps */
    btile *p = aligned_alloc(64, want * sizeof *p);
    if (!p || pthread_setspecific(scratch_key, p) != 0) {
        free(p);
        return NULL;
    }
    free(scratch);
    scratch = p;
    scratch_tiles = want;
    return p;
}

/* ---- a decode step on vector loads: the tile unit's numbers without its tile loads.
 *
 * What tdpbf16ps computes, bit for bit (a probe over 7 million outputs against the hardware,
 * values from the underflow boundary to overflow, zeros, denormals, infinities; session 31;
 * the SDM's pseudocode says the same): each C element takes two float FMA chains from zero over
 * its 16 pairs, one through the pairs' even elements and one through their odd elements, with
 * nearest-even rounding, inputs and outputs below float's normal range flushed to zero (DAZ,
 * FTZ), then C + (even + odd). Only NaNs may carry other payloads. So a decode step (one
 * token) takes the same numbers from AVX-512 FMAs with 16 rows in a vector's lanes (a 16 x 16
 * transpose of each chunk), under MXCSR's DAZ and FTZ: it reads its weights through vector
 * loads, which stream about 15% more a core than tile loads (docs/benchmarks.md, sessions
 * 30-31), and a token gets the same bits alone as in a prompt's tiles (batch invariance holds
 * across the two engines). Each lane is one stream of consecutive rows (rows r0 + i * run + j),
 * prefetched ahead as the vector tables' decode is (float_rows.h), not 16 rows of one block.
 * Two tokens already run slower this way than on tiles (their FMAs double; the transpose and
 * the parts' three chains bound it: 33 against 55 GFLOP/s a core from cache). */

#define VEC_PF_BYTES 1024 /* each stream's prefetch distance */

/* A token's parts as the tile path's B tiles hold them (pairs() keeps a float's high half),
 * chunk by chunk: dst[(s * nk + c) * CHUNK + i] is part s of column 32c - lead + i, zero outside
 * [0, cols). Runs under the caller's MXCSR, as stage_tile. */
static void stage_parts(const float *x, int64_t cols, int64_t lead, int64_t nk, float *dst)
{
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t c = 0; c < nk; c++)
        for (int h = 0; h < 2; h++) {
            int64_t k = c * CHUNK - lead + 16 * h;
            __m512 p[3];
            split3(_mm512_maskz_loadu_ps(cols16(k, cols), moved(x, k * 4)), &p[0], &p[1], &p[2]);
            for (int s = 0; s < 3; s++)
                _mm512_store_ps(dst + (s * nk + c) * CHUNK + 16 * h,
                                _mm512_castsi512_ps(
                                    _mm512_and_si512(_mm512_castps_si512(p[s]), high)));
        }
}

#define MXCSR_DAZ_FTZ 0x8040u

/* A chunk's 64 bytes of 16 rows, lane i's at q + i * S (bytes; S3 = 3 * S): four base
 * addresses and the stride, so that the 16 addresses need no registers of their own. n: the
 * lanes that hold rows (the others read nothing and stay zero); m: the chunk's columns inside
 * the row (all 32 where the chunk lies wholly inside). pf: prefetch each lane VEC_PF_BYTES on
 * (past a stream's end too: a prefetch never faults). Addresses are formed in integers, as
 * moved(): a head chunk's and an idle lane's may lie outside the matrix, masked off. */
INLINE void load16(uintptr_t q, int64_t S, int64_t S3, int n, __mmask32 m, int pf, int pf_l2,
                   __m512i v[16], int FULL)
{
    const uintptr_t b[4] = {q, q + (uintptr_t)(4 * S), q + (uintptr_t)(8 * S),
                            q + (uintptr_t)(12 * S)};
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const uintptr_t a[4] = {b[j], b[j] + (uintptr_t)S, b[j] + (uintptr_t)(2 * S),
                                b[j] + (uintptr_t)S3};
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            if (pf)
                kwk_prefetch((const void *)(a[i] + VEC_PF_BYTES), pf_l2);
            if (FULL)
                v[4 * j + i] = _mm512_loadu_si512((const void *)a[i]);
            else
                v[4 * j + i] =
                    _mm512_maskz_loadu_epi16(4 * j + i < n ? m : 0, (const void *)a[i]);
        }
    }
}

/* 16 lanes of rows, lane i's row at row0 + i * S bytes (n of them real: the rest read nothing),
 * times the staged parts: the tile path's (c0 + c1) + c2, lane by lane. csr: the caller's MXCSR,
 * the state the tile path's last sums run in (its C tiles' own sums flush as DAZ and FTZ do).
 * FULL: all 16 lanes real, and the chunks in [lo, hi) read by plain loads, prefetched. */
INLINE __m512 vec_group(const struct kwk_mat *w, const struct chunks *g, const char *row0,
                        int64_t S, int n, const float *parts, unsigned csr, int pf_l2, int FULL)
{
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    int64_t nk = g->nk, cols = w->cols, S3 = 3 * S;
    __m512 acc[3] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    _mm_setcsr(csr | MXCSR_DAZ_FTZ);
    for (int64_t c = 0; c < nk; c++) {
        int64_t k = c * CHUNK - g->lead;
        uintptr_t q = (uintptr_t)row0 + (uintptr_t)(k * 2);
        __m512i v[16];
        if (c >= g->lo && c < g->hi)
            load16(q, S, S3, n, (__mmask32)~0u, FULL, pf_l2, v, FULL);
        else /* the head or a partial last chunk: zeros outside the row, as a_src's copy */
            load16(q, S, S3, n, cols32(k, cols), 0, pf_l2, v, 0);
        transpose16(v); /* v[p]: pair p of the 16 rows */
        __m512 e[3], o[3];
        for (int s = 0; s < 3; s++)
            e[s] = o[s] = _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int p = 0; p < 16; p++) {
            __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v[p], 16));
            __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v[p], high));
#pragma GCC unroll 3
            for (int s = 0; s < 3; s++) {
                const float *x = parts + (s * nk + c) * CHUNK + 2 * p;
                e[s] = _mm512_fmadd_ps(we, _mm512_set1_ps(x[0]), e[s]);
                o[s] = _mm512_fmadd_ps(wo, _mm512_set1_ps(x[1]), o[s]);
            }
        }
        for (int s = 0; s < 3; s++)
            acc[s] = _mm512_add_ps(acc[s], _mm512_add_ps(e[s], o[s]));
    }
    _mm_setcsr(csr);
    return _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), acc[2]);
}

static __m512 vec_group_full(const struct kwk_mat *w, const struct chunks *g, const char *row0,
                             int64_t S, const float *parts, unsigned csr, int pf_l2)
{
    return vec_group(w, g, row0, S, 16, parts, csr, pf_l2, 1);
}

static __m512 vec_group_part(const struct kwk_mat *w, const struct chunks *g, const char *row0,
                             int64_t S, int n, const float *parts, unsigned csr)
{
    return vec_group(w, g, row0, S, n, parts, csr, 0, 0);
}

/* Rows [r0, r1) of one token's staged parts into y: 16 streams of run consecutive rows (lane i
 * row r0 + i * run + j at step j: each lane reads one long run, as the vector tables' decode
 * does, float_rows.h), then the rest (under 16 rows) as one group of fewer lanes. */
static void vec_rows(const struct kwk_mat *w, const struct chunks *g, const float *parts, float *y,
                     int64_t r0, int64_t r1)
{
    int64_t row_bytes = w->cols * 2, run = (r1 - r0) / 16, rest0 = r0 + 16 * run;
    const char *base = w->data;
    unsigned csr = _mm_getcsr();
    int pf_l2 = kwk_cpu_prefetch_l2();
    _Alignas(64) float lane[16];
    for (int64_t j = 0; j < run; j++) {
        _mm512_store_ps(lane, vec_group_full(w, g, base + (r0 + j) * row_bytes, run * row_bytes,
                                             parts, csr, pf_l2));
        for (int i = 0; i < 16; i++)
            y[r0 + i * run + j] = lane[i];
    }
    if (rest0 < r1) {
        int n = (int)(r1 - rest0);
        _mm512_store_ps(lane, vec_group_part(w, g, base + rest0 * row_bytes, row_bytes, n, parts,
                                             csr));
        for (int i = 0; i < n; i++)
            y[rest0 + i] = lane[i];
    }
}

void *kwk_amx_stage(size_t bytes)
{
    return stage_buffer((bytes + sizeof(btile) - 1) / sizeof(btile));
}

static int no_vec; /* kwk_bf16_amx_test_engine */

void kwk_bf16_amx_test_no_scratch(int on)
{
    no_scratch = on;
}

void kwk_bf16_amx_test_engine(int tiles_only)
{
    no_vec = tiles_only;
}

int64_t kwk_bf16_amx_test_lead(const struct kwk_mat *w)
{
    return chunks_of(w).lead;
}

void kwk_bf16_amx_test_head_cols(int64_t cols)
{
    head_min_cols = cols > 0 ? cols : HEAD_MIN_COLS;
}

void kwk_bf16_matmul_amx(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                         int64_t r0, int64_t r1)
{
    const struct chunks g = chunks_of(w);
    int64_t cols = w->cols, nk = g.nk;
    int tiles = (n_tok + TILE_TOKS - 1) / TILE_TOKS;
    if (n_tok == 1 && !no_vec) { /* a decode step: the vector engine */
        size_t bytes = 3 * (size_t)nk * CHUNK * sizeof(float);
        float *parts = (float *)stage_buffer((bytes + sizeof(btile) - 1) / sizeof(btile));
        if (parts) {
            stage_parts(x, cols, g.lead, nk, parts);
            vec_rows(w, &g, parts, y, r0, r1);
            return;
        }
    }
    _tile_loadconfig(&TILES16_CONFIG);
    if (tiles == 1) { /* a decode step's shape: groups of whole rows under one B tile */
        btile *st = stage_buffer((size_t)nk);
        if (st) {
            stage_tile(x, cols, g.lead, n_tok, 0, nk, st);
            __asm__ volatile("" ::: "memory"); /* staged before the tile loads */
        }
        tile_rows(w, &g, st, x, n_tok, r0, r1, y, ldy, 0);
        _tile_release();
        return;
    }
    /* Prompts: token blocks of up to MAX_TILES tiles, each staged a column block at a time (as
     * many chunks as STAGE_BYTES holds), every row block of the thread's rows run over it; C
     * tiles wait in the buffer's spill between column blocks. So a weight is read once a token
     * block whatever the row length (SmolLM2-1.7B's 8192-column rows took 2 tiles a block
     * without column blocks). */
    int per_block = KWK_MIN(MAX_TILES, tiles);
    int64_t width = KWK_MIN(nk, KWK_MAX(1, (int64_t)(STAGE_BYTES / sizeof(btile)) / per_block));
    size_t staged = (size_t)per_block * (size_t)width;
    size_t spills = width < nk ? (size_t)((r1 - r0 + 15) / 16) * (size_t)per_block : 0;
    _Static_assert(sizeof(btile) == sizeof(float[16][16]), "a spilled C tile takes a B's room");
    btile *st = stage_buffer(staged + spills);
    if (!st) {
        for (int i = 0; i < tiles; i++) {
            int t = i * TILE_TOKS;
            tile_rows(w, &g, NULL, x + (int64_t)t * cols, KWK_MIN(TILE_TOKS, n_tok - t), r0, r1,
                      y, ldy, t);
        }
        _tile_release();
        return;
    }
    struct cblock cb = {.w = w, .g = &g, .width = width, .st = st,
                        .spill = (float(*)[16][16])(void *)(st + staged), .tiles = per_block,
                        .y = y, .ldy = ldy};
    for (int i0 = 0; i0 < tiles; i0 += per_block) {
        int nb = KWK_MIN(per_block, tiles - i0);
        for (cb.c0 = 0; cb.c0 < nk; cb.c0 = cb.c1) {
            cb.c1 = KWK_MIN(nk, cb.c0 + width);
            for (int j = 0; j < nb; j++) {
                int t = (i0 + j) * TILE_TOKS;
                stage_tile(x + (int64_t)t * cols, cols, g.lead, KWK_MIN(TILE_TOKS, n_tok - t),
                           cb.c0, cb.c1, st + (size_t)j * (size_t)width);
            }
            __asm__ volatile("" ::: "memory"); /* staged before the tile loads */
            /* pairs of row blocks x pairs of tiles: each A load feeds two multiplies, each B
             * load two */
            int64_t ib = 0;
            for (int64_t rb = r0; rb < r1; rb += 32, ib += 2) {
                int nr0 = (int)KWK_MIN(16, r1 - rb), nr1 = (int)KWK_MIN(16, r1 - rb - 16);
                for (int j = 0; j < nb; j += 2) {
                    int t = (i0 + j) * TILE_TOKS, two = j + 1 < nb;
                    int nt0 = KWK_MIN(TILE_TOKS, n_tok - t);
                    int nt1 = two ? KWK_MIN(TILE_TOKS, n_tok - t - TILE_TOKS) : 0;
                    BLOCKS[nr1 > 0][two](&cb, ib, j, rb, nr0, nr1, t, nt0, nt1);
                }
            }
        }
    }
    /* back to the initial state: a thread that holds no tile data costs no 8 KiB at a context
     * switch */
    _tile_release();
}
