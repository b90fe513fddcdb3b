/* amx_bf16t.c - preserve's products of bf16 weights packed in tile order (KWK_W_BF16T,
 * bf16t.h), every product exact, in the tile unit's sums: on AMX-BF16 tiles where
 * kwk_cpu_amx_bf16(), prompts and decode steps alike; elsewhere on AVX-512 FMAs that compute the
 * same sums bit for bit (amx_bf16.c says how tdpbf16ps was found to sum). Pure functions; any
 * thread (a tile call loads its own configuration).
 *
 * Tiles: B is a packed 1 KiB, 16 weight rows as its columns; A 16 rows of 32 columns, row
 * 3j + s holding part s of token j (5 tokens a tile, row 15 zero); C [token part][weight row],
 * and a token's outputs are (C[3j] + C[3j+1]) + C[3j+2], a row of 16 outputs (nothing to
 * transpose). Every tile load reads 1 KiB of contiguous memory. Prompts block as amx_bf16.c
 * does: token blocks of up to 12 tiles, column blocks whose staged tiles fit in 1 MiB, 2 row
 * blocks x 2 token tiles a step, C tiles spilled between column blocks (exact). A decode step
 * (one A tile) runs four row blocks under each chunk's A load, four streams.
 *
 * The vector engine (no AMX): pair p of a block's 16 rows is one 64-byte vector (its even
 * columns in the low halves, its odd ones in the high halves), so the tile unit's even and odd
 * chains are FMAs with 16 rows in the lanes, under MXCSR's DAZ and FTZ, with no transpose; a
 * thread's blocks are read as DEC_STREAMS sequential streams side by side. */
#include <immintrin.h>
#include <stdint.h>

#include "base/base.h"
#include "kernels/amx_bf16.h"
#include "kernels/amx_tiles16.h"
#include "kernels/bf16_split.h"
#include "kernels/bf16t.h"

#define INLINE static inline __attribute__((always_inline))

#define CHUNK KWK_BF16T_CHUNK
#define TILE_TOKS 5                    /* tokens an A tile holds, three rows each */
#define STAGE_BYTES (1024u * 1024u)    /* a column block's staged A tiles, at most (amx_bf16.c) */
#define MAX_TILES 12                   /* A tiles a token block, at most (60 tokens) */
#define MXCSR_DAZ_FTZ 0x8040u

/* 1 KiB: a B tile of packed weights ([pair][row]) or an A tile of parts ([token part][column
 * pair]), or a C tile's 16 x 16 floats */
typedef uint32_t tile[16][16];

static int vector_only; /* kwk_bf16t_test_vector */

void kwk_bf16t_test_vector(int on)
{
    vector_only = on;
}

/* Block b's chunk c. */
INLINE const tile *wtile(const struct kwk_mat *w, int64_t nk, int64_t b, int64_t c)
{
    return (const tile *)w->data + b * nk + c;
}

/* x + k floats, formed in integers: past a row's end the lanes are masked off, never read. */
INLINE const void *at(const float *x, int64_t k)
{
    return (const void *)((uintptr_t)x + (uintptr_t)(k * 4));
}

/* Rows [r0, r1) among block rows rb .. rb + 15, as lanes. */
INLINE __mmask16 rows_in(int64_t rb, int64_t r0, int64_t r1)
{
    return (__mmask16)(lanes16(r1 - rb) & ~lanes16(r0 - rb));
}

/* ---- prompts on tiles ----------------------------------------------------------------------- */

/* Chunks [c0, c1) of the A tile of tokens x[0 .. nt) (nt <= 5, rows cols apart) into dst[0 ..
 * c1 - c0): row 3j + s = part s of token j's 32 columns as bf16; absent tokens, row 15 and
 * columns past cols zero. Under the caller's MXCSR (the parts are exact differences). */
static void stage_a(const float *x, int64_t cols, int nt, int64_t c0, int64_t c1, tile *dst)
{
    const __m512i idx = _mm512_load_si512(HIGH_HALVES);
    for (int64_t c = c0; c < c1; c++) {
        int64_t k = c * CHUNK;
        __mmask16 mlo = lanes16(cols - k), mhi = lanes16(cols - k - 16);
        uint32_t(*d)[16] = dst[c - c0];
        for (int j = 0; j < TILE_TOKS; j++) {
            __m512i r[3] = {_mm512_setzero_si512(), _mm512_setzero_si512(),
                            _mm512_setzero_si512()};
            if (j < nt) {
                const float *row = x + (int64_t)j * cols;
                __m512 l[3], h[3];
                split3(_mm512_maskz_loadu_ps(mlo, at(row, k)), &l[0], &l[1], &l[2]);
                split3(_mm512_maskz_loadu_ps(mhi, at(row, k + 16)), &h[0], &h[1], &h[2]);
                for (int s = 0; s < 3; s++)
                    r[s] = pairs(l[s], h[s], idx);
            }
            for (int s = 0; s < 3; s++)
                _mm512_store_si512(d[3 * j + s], r[s]);
        }
        _mm512_store_si512(d[15], _mm512_setzero_si512());
    }
}

/* A prompt's token block over one column block: chunks [c0, c1) of nk, staged A tiles
 * st[tile][c - c0] (width chunks each; NULL: staged chunk by chunk from x, one column block
 * only), C tiles spilled between column blocks in spill[block - b0][tile]. */
struct pblock {
    const struct kwk_mat *w;
    int64_t nk, c0, c1, width, b0, r0, r1;
    tile *st;
    tile *spill;
    int tiles; /* spill's tiles a row block */
    const float *x;
    int n_tok;
    float *y;
    long ldy;
};

/* A C tile stored in cbuf (tokens t .. t + nt - 1 x block rows rb ..) into y, rows in [r0, r1)
 * only. */
INLINE void put_c(const struct pblock *pb, float (*cbuf)[16], int64_t rb, int t, int nt)
{
    __asm__ volatile("" ::: "memory"); /* the tile store first */
    __mmask16 m = rows_in(rb, pb->r0, pb->r1);
    for (int j = 0; j < nt; j++) {
        __m512 s = _mm512_add_ps(_mm512_load_ps(cbuf[3 * j]), _mm512_load_ps(cbuf[3 * j + 1]));
        s = _mm512_add_ps(s, _mm512_load_ps(cbuf[3 * j + 2]));
        _mm512_mask_storeu_ps(pb->y + (int64_t)(t + j) * pb->ldy + rb, m, s);
    }
}

#define C_START(tc, b, j)                                                                          \
    do {                                                                                           \
        if (pb->c0 == 0)                                                                           \
            _tile_zero(tc);                                                                        \
        else                                                                                       \
            _tile_loadd(tc, pb->spill[((b) - pb->b0) * pb->tiles + (j)], 64);                      \
    } while (0)

#define C_END(tc, b, j, t, nt)                                                                     \
    do {                                                                                           \
        if (pb->c1 == pb->nk) {                                                                    \
            _tile_stored(tc, cbuf, 64);                                                            \
            put_c(pb, cbuf, (b) * 16, t, nt);                                                      \
        } else {                                                                                   \
            _tile_stored(tc, pb->spill[((b) - pb->b0) * pb->tiles + (j)], 64);                     \
        }                                                                                          \
    } while (0)

/* A tile j's chunk c: staged, or staged here into buf. */
INLINE const tile *a_tile(const struct pblock *pb, int j, int64_t c, tile *buf)
{
    if (pb->st)
        return pb->st + (size_t)j * (size_t)pb->width + (size_t)(c - pb->c0);
    int t = j * TILE_TOKS;
    stage_a(pb->x + (int64_t)t * pb->w->cols, pb->w->cols, KWK_MIN(TILE_TOKS, pb->n_tok - t), c,
            c + 1, buf);
    __asm__ volatile("" ::: "memory"); /* GCC's tileloadd has no memory operand */
    return buf;
}

/* Row blocks b and b + 1 (RB = 1: b only) x token tiles j and j + 1 (NT = 1: j only) over the
 * column block: each B load feeds NT multiplies, each A load RB. */
INLINE void block(const struct pblock *pb, int64_t b, int j, int RB, int NT)
{
    _Alignas(64) tile abuf[2];
    _Alignas(64) float cbuf[16][16];
    int t0 = j * TILE_TOKS, nt0 = KWK_MIN(TILE_TOKS, pb->n_tok - t0);
    int t1 = t0 + TILE_TOKS, nt1 = NT > 1 ? KWK_MIN(TILE_TOKS, pb->n_tok - t1) : 0;
    C_START(TC0, b, j);
    if (NT > 1)
        C_START(TC1, b, j + 1);
    if (RB > 1)
        C_START(TC2, b + 1, j);
    if (RB > 1 && NT > 1)
        C_START(TC3, b + 1, j + 1);
    for (int64_t c = pb->c0; c < pb->c1; c++) {
        _tile_loadd(TB0, wtile(pb->w, pb->nk, b, c), 64);
        _tile_loadd(TA0, a_tile(pb, j, c, &abuf[0]), 64);
        _tile_dpbf16ps(TC0, TA0, TB0);
        if (NT > 1) {
            _tile_loadd(TA1, a_tile(pb, j + 1, c, &abuf[1]), 64);
            _tile_dpbf16ps(TC1, TA1, TB0);
        }
        if (RB > 1) {
            _tile_loadd(TB1, wtile(pb->w, pb->nk, b + 1, c), 64);
            _tile_dpbf16ps(TC2, TA0, TB1);
            if (NT > 1)
                _tile_dpbf16ps(TC3, TA1, TB1);
        }
    }
    C_END(TC0, b, j, t0, nt0);
    if (NT > 1)
        C_END(TC1, b, j + 1, t1, nt1);
    if (RB > 1)
        C_END(TC2, b + 1, j, t0, nt0);
    if (RB > 1 && NT > 1)
        C_END(TC3, b + 1, j + 1, t1, nt1);
}

typedef void (*block_fn)(const struct pblock *, int64_t, int);
#define BLOCK_FN(RB, NT)                                                                           \
    static void block_##RB##_##NT(const struct pblock *pb, int64_t b, int j)                       \
    {                                                                                              \
        block(pb, b, j, RB, NT);                                                                   \
    }
BLOCK_FN(1, 1)
BLOCK_FN(1, 2)
BLOCK_FN(2, 1)
BLOCK_FN(2, 2)
static const block_fn BLOCKS[2][2] = {{block_1_1, block_1_2}, {block_2_1, block_2_2}};

/* Each stream of a decode group prefetches this far ahead (bytes): 3-8% more tokens/s in the
 * model than none or 4 KiB (SmolLM2-135M, Qwen2.5-0.5B, SmolLM2-1.7B; noisy, session 32). */
#define DEC_PF_BYTES 1024

/* A decode step's shape on tiles (one A tile, up to 5 tokens): G row blocks from b share each
 * chunk's A load, each block a stream of its own. Four blocks: a generated token about as fast
 * as on the vector tables; two 6% slower, the vector engine 2-13% (in the model, session 32). */
INLINE void dec_group(const struct pblock *pb, int64_t b, int G)
{
    _Alignas(64) tile abuf[1];
    _Alignas(64) float cbuf[16][16];
    const int pf_l2 = kwk_mat_prefetch_l2(pb->w);
    int nt = KWK_MIN(TILE_TOKS, pb->n_tok);
    _tile_zero(TC0);
    if (G > 1)
        _tile_zero(TC1);
    if (G > 2)
        _tile_zero(TC2);
    if (G > 3)
        _tile_zero(TC3);
    for (int64_t c = 0; c < pb->nk; c++) {
        for (int g = 0; g < G; g++)
            kwk_prefetch_bytes((const void *)((uintptr_t)wtile(pb->w, pb->nk, b + g, c) +
                                              (uintptr_t)DEC_PF_BYTES),
                               sizeof(tile), pf_l2);
        _tile_loadd(TA0, a_tile(pb, 0, c, &abuf[0]), 64);
        _tile_loadd(TB0, wtile(pb->w, pb->nk, b, c), 64);
        _tile_dpbf16ps(TC0, TA0, TB0);
        if (G > 1) {
            _tile_loadd(TB1, wtile(pb->w, pb->nk, b + 1, c), 64);
            _tile_dpbf16ps(TC1, TA0, TB1);
        }
        if (G > 2) {
            _tile_loadd(TB0, wtile(pb->w, pb->nk, b + 2, c), 64);
            _tile_dpbf16ps(TC2, TA0, TB0);
        }
        if (G > 3) {
            _tile_loadd(TB1, wtile(pb->w, pb->nk, b + 3, c), 64);
            _tile_dpbf16ps(TC3, TA0, TB1);
        }
    }
    _tile_stored(TC0, cbuf, 64);
    put_c(pb, cbuf, b * 16, 0, nt);
    if (G > 1) {
        _tile_stored(TC1, cbuf, 64);
        put_c(pb, cbuf, (b + 1) * 16, 0, nt);
    }
    if (G > 2) {
        _tile_stored(TC2, cbuf, 64);
        put_c(pb, cbuf, (b + 2) * 16, 0, nt);
    }
    if (G > 3) {
        _tile_stored(TC3, cbuf, 64);
        put_c(pb, cbuf, (b + 3) * 16, 0, nt);
    }
}

typedef void (*dec_fn)(const struct pblock *, int64_t);
#define DEC_FN(G)                                                                                  \
    static void dec_##G(const struct pblock *pb, int64_t b)                                        \
    {                                                                                              \
        dec_group(pb, b, G);                                                                       \
    }
DEC_FN(1)
DEC_FN(2)
DEC_FN(3)
DEC_FN(4)
static const dec_fn DECS[5] = {NULL, dec_1, dec_2, dec_3, dec_4};

/* Token tiles [0, nb) of pb (its x, y and n_tok start at the token block) over row blocks
 * [b0, b1), for each column block. */
static void token_block(struct pblock *pb, int nb, int64_t b1)
{
    for (pb->c0 = 0; pb->c0 < pb->nk; pb->c0 = pb->c1) {
        pb->c1 = KWK_MIN(pb->nk, pb->c0 + pb->width);
        if (pb->st) {
            for (int j = 0; j < nb; j++) {
                int t = j * TILE_TOKS;
                stage_a(pb->x + (int64_t)t * pb->w->cols, pb->w->cols,
                        KWK_MIN(TILE_TOKS, pb->n_tok - t), pb->c0, pb->c1,
                        pb->st + (size_t)j * (size_t)pb->width);
            }
            __asm__ volatile("" ::: "memory"); /* staged before the tile loads */
        }
        for (int64_t b = pb->b0; b < b1; b += 2)
            for (int j = 0; j < nb; j += 2)
                BLOCKS[b + 1 < b1][j + 1 < nb](pb, b, j);
    }
}

static void tiles_matmul(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                         int64_t r0, int64_t r1)
{
    int64_t nk = kwk_bf16t_chunks(w->cols), b0 = r0 / 16, b1 = (r1 + 15) / 16;
    int tiles = (n_tok + TILE_TOKS - 1) / TILE_TOKS;
    int per_block = KWK_MIN(MAX_TILES, tiles);
    /* one A tile (a decode step's shape) is staged whole row at once: no column blocks */
    int64_t width = tiles == 1 ? nk
                               : KWK_MIN(nk, KWK_MAX(1, (int64_t)(STAGE_BYTES / sizeof(tile)) /
                                                            per_block));
    size_t staged = (size_t)per_block * (size_t)width;
    size_t spills = width < nk ? (size_t)(b1 - b0) * (size_t)per_block : 0;
    tile *st = kwk_amx_stage((staged + spills) * sizeof(tile));
    struct pblock pb = {.w = w, .nk = nk, .width = width, .b0 = b0, .r0 = r0, .r1 = r1,
                        .st = st, .spill = st ? st + staged : NULL, .tiles = per_block,
                        .x = x, .n_tok = n_tok, .y = y, .ldy = ldy};
    if (!st) { /* no staging buffer: each chunk staged as read, one column block */
        pb.width = nk;
        per_block = tiles;
    }
    _tile_loadconfig(&TILES16_CONFIG);
    if (tiles == 1) { /* one A tile: groups of row blocks under it */
        if (st) {
            stage_a(x, w->cols, n_tok, 0, nk, st);
            __asm__ volatile("" ::: "memory"); /* staged before the tile loads */
        }
        for (int64_t b = b0; b < b1; b += 4)
            DECS[KWK_MIN(4, b1 - b)](&pb, b);
        _tile_release();
        return;
    }
    for (int i0 = 0; i0 < tiles; i0 += per_block) {
        int nb = KWK_MIN(per_block, tiles - i0);
        pb.x = x + (int64_t)i0 * TILE_TOKS * w->cols;
        pb.y = y + (int64_t)i0 * TILE_TOKS * ldy;
        pb.n_tok = n_tok - i0 * TILE_TOKS;
        token_block(&pb, nb, b1);
    }
    /* back to the initial state: a thread that holds no tile data costs no 8 KiB at a context
     * switch */
    _tile_release();
}

/* ---- a decode step on vector loads ---------------------------------------------------------- */

/* Blocks a thread reads side by side in a decode step (its blocks cut into this many runs). */
#define DEC_STREAMS KWK_BF16T_DEC_RUNS
/* Each stream prefetches this far ahead (bytes): 2 KiB read 15% faster than none, 1 KiB or 4-8
 * KiB about as fast (bench_kernels, session 32). */
#define VEC_PF_BYTES 2048

/* Chunks [c0, c1) of a token's parts as the A tiles hold them (high halves), for FMA
 * broadcasts: dst[((c - c0) * 3 + s) * CHUNK + i] = part s of column 32c + i, zero past cols.
 * Under the caller's MXCSR, as stage_a. */
static void stage_parts(const float *x, int64_t cols, int64_t c0, int64_t c1, float *dst)
{
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t c = c0; c < c1; c++)
        for (int h = 0; h < 2; h++) {
            int64_t k = c * CHUNK + 16 * h;
            __m512 p[3];
            split3(_mm512_maskz_loadu_ps(lanes16(cols - k), at(x, k)), &p[0], &p[1], &p[2]);
            for (int s = 0; s < 3; s++)
                _mm512_store_ps(dst + ((c - c0) * 3 + s) * CHUNK + 16 * h,
                                _mm512_castsi512_ps(
                                    _mm512_and_si512(_mm512_castps_si512(p[s]), high)));
        }
}

/* NB blocks' outputs (blk[i]: a block's first chunk) for one token: parts staged for every
 * chunk, or (x non-NULL) staged here chunk by chunk. csr: the caller's MXCSR, in which the parts
 * are made and the last (C1 + C2) + C3 summed, as the tile path does. */
INLINE void vec_blocks(const tile *const *blk, int64_t nk, const float *parts, const float *x,
                       int64_t cols, unsigned csr, int pf_l2, __m512 *out, int NB)
{
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    _Alignas(64) float here[3 * CHUNK];
    __m512 acc[DEC_STREAMS][3];
    for (int b = 0; b < NB; b++)
        for (int s = 0; s < 3; s++)
            acc[b][s] = _mm512_setzero_ps();
    _mm_setcsr(csr | MXCSR_DAZ_FTZ);
    for (int64_t c = 0; c < nk; c++) {
        const float *xp = here;
        if (x) {
            _mm_setcsr(csr);
            stage_parts(x, cols, c, c + 1, here);
            _mm_setcsr(csr | MXCSR_DAZ_FTZ);
        } else {
            xp = parts + c * 3 * CHUNK;
        }
        for (int b = 0; b < NB; b++)
            kwk_prefetch_bytes((const void *)((uintptr_t)blk[b][c] + VEC_PF_BYTES), sizeof(tile),
                               pf_l2);
        __m512 e[DEC_STREAMS][3], o[DEC_STREAMS][3];
        for (int b = 0; b < NB; b++)
            for (int s = 0; s < 3; s++)
                e[b][s] = o[b][s] = _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int p = 0; p < 16; p++)
            for (int b = 0; b < NB; b++) {
                __m512i v = _mm512_loadu_si512(blk[b][c][p]);
                __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
                __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, high));
#pragma GCC unroll 3
                for (int s = 0; s < 3; s++) {
                    e[b][s] = _mm512_fmadd_ps(we, _mm512_set1_ps(xp[s * CHUNK + 2 * p]), e[b][s]);
                    o[b][s] =
                        _mm512_fmadd_ps(wo, _mm512_set1_ps(xp[s * CHUNK + 2 * p + 1]), o[b][s]);
                }
            }
        for (int b = 0; b < NB; b++)
            for (int s = 0; s < 3; s++)
                acc[b][s] = _mm512_add_ps(acc[b][s], _mm512_add_ps(e[b][s], o[b][s]));
    }
    _mm_setcsr(csr);
    for (int b = 0; b < NB; b++)
        out[b] = _mm512_add_ps(_mm512_add_ps(acc[b][0], acc[b][1]), acc[b][2]);
}

static void vec_one(const tile *const *blk, int64_t nk, const float *parts, const float *x,
                    int64_t cols, unsigned csr, int pf_l2, __m512 *out)
{
    vec_blocks(blk, nk, parts, x, cols, csr, pf_l2, out, 1);
}

static void vec_streams(const tile *const *blk, int64_t nk, const float *parts, const float *x,
                        int64_t cols, unsigned csr, int pf_l2, __m512 *out)
{
    vec_blocks(blk, nk, parts, x, cols, csr, pf_l2, out, DEC_STREAMS);
}

/* One token x into y over rows [r0, r1): the thread's blocks as DEC_STREAMS runs side by side,
 * then the blocks left over one at a time. */
static void vec_matmul(const struct kwk_mat *w, const float *x, float *y, int64_t r0,
                       int64_t r1)
{
    int64_t cols = w->cols, nk = kwk_bf16t_chunks(cols), b0 = r0 / 16, b1 = (r1 + 15) / 16;
    unsigned csr = _mm_getcsr();
    int pf_l2 = kwk_mat_prefetch_l2(w);
    float *parts = kwk_amx_stage((size_t)nk * 3 * CHUNK * sizeof(float));
    const float *xs = NULL; /* staged chunk by chunk (no buffer) */
    if (parts)
        stage_parts(x, cols, 0, nk, parts);
    else
        xs = x;
    int64_t run = (b1 - b0) / DEC_STREAMS;
    __m512 out[DEC_STREAMS];
    for (int64_t j = 0; j < run; j++) {
        const tile *blk[DEC_STREAMS];
        for (int i = 0; i < DEC_STREAMS; i++)
            blk[i] = wtile(w, nk, b0 + i * run + j, 0);
        vec_streams(blk, nk, parts, xs, cols, csr, pf_l2, out);
        for (int i = 0; i < DEC_STREAMS; i++) {
            int64_t rb = (b0 + i * run + j) * 16;
            _mm512_mask_storeu_ps(y + rb, rows_in(rb, r0, r1), out[i]);
        }
    }
    for (int64_t b = b0 + DEC_STREAMS * run; b < b1; b++) {
        const tile *blk[1] = {wtile(w, nk, b, 0)};
        vec_one(blk, nk, parts, xs, cols, csr, pf_l2, out);
        _mm512_mask_storeu_ps(y + b * 16, rows_in(b * 16, r0, r1), out[0]);
    }
}

void kwk_bf16t_matmul_avx512(const struct kwk_mat *w, const float *x, int n_tok, float *y,
                             long ldy, int64_t r0, int64_t r1)
{
    if (r1 <= r0 || n_tok <= 0)
        return;
    if (kwk_cpu_amx_bf16() && !vector_only) {
        tiles_matmul(w, x, n_tok, y, ldy, r0, r1);
        return;
    }
    for (int t = 0; t < n_tok; t++) /* no tiles here: the vector engine, a token at a time */
        vec_matmul(w, x + (int64_t)t * w->cols, y + (int64_t)t * ldy, r0, r1);
}
