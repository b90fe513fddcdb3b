/* amx_quant.c - the quantized prompt tiles on AMX (Intel Xeon since Sapphire Rapids): each
 * group's integer dot products of 16 tokens x 16 rows in one tile multiply, the float epilogue
 * in AVX-512 exactly as the VNNI tiles of avx512_quant.c do it. Pure functions; any thread
 * (each loads its own tile configuration). Only called where kwk_cpu_amx().
 *
 * Why it is exact: vpdpbusd and tdpbssd both sum int8 products into 32-bit integers without
 * overflow here, so a group's sums are the same integers whichever computes them; the epilogue
 * below then does the VNNI tiles' float operations on them in their order (per group: convert,
 * d_w * d_x, fused multiply-add; int4's offset term after it; passes added into y in order).
 *
 * Layout: quant.h's blocks already hold a group of 16 rows as [col/4][row][col%4], which is
 * AMX's B operand (K/4 rows of 16 x 4 bytes). A row block's groups of one column pass are staged
 * once as signed bytes (int8 w = q - 128, int6 u - 32, int4's nibbles unpacked) into a 32 KiB
 * buffer that every 16-token tile of the pass then reads: signed weights need no correction by
 * the activations' sums, which is what the VNNI tiles' -128 * sum(v) start is for. A is 16
 * tokens' 32 activation bytes of the group (their rows of the quantized activations, strided),
 * C the 16 x 16 sums, stored to the stack and read back by the epilogue a token at a time: row j
 * of C is token j's 16 row sums, one register, as the VNNI tile's accumulator.
 *
 * Groups of 32 columns use half of what one tile multiply could take (K = 64) and its time, and
 * every multiply's 1 KiB of sums goes through memory to its own epilogue: those stores and the
 * epilogue, not the multiply, bound these tiles, and they do not overlap the tile unit's work
 * (docs/benchmarks.md, session 26): while tile multiplies run, the core's 512-bit FMA rate halves
 * (session 34; 256-bit FMAs keep theirs, but do half the lanes, and 32 ymm accumulators spill). */
#include <immintrin.h>
#include <stdint.h>

#include "base/base.h"
#include "kernels/amx.h"
#include "kernels/avx512_quant.h"
#include "kernels/quant.h"

/* Tile registers: C sums (with 8-bit activations four, one a group in turn; with 16-bit two
 * pairs of high and low halves' sums), A activations (8-bit: alternate groups; 16-bit: the
 * high and low halves), B the weights of alternate groups. */
#define TC0 0
#define TC1 1
#define TC2 2
#define TC3 3
#define TAH 4
#define TAL 5
#define TB0 6
#define TB1 7

/* The tiles' shapes: C 16 tokens x 16 rows of int32, A 16 tokens x 32 bytes, B 8 x (16 rows x 4
 * bytes); a constant (amx.h says why). */
static const _Alignas(64) struct kwk_amx_config TILE_CONFIG = {
    .palette = 1,
    .colsb = {[TC0] = KWK_QROWS * 4, [TC1] = KWK_QROWS * 4, [TC2] = KWK_QROWS * 4,
              [TC3] = KWK_QROWS * 4, [TAH] = KWK_QACT_GROUP, [TAL] = KWK_QACT_GROUP,
              [TB0] = KWK_QROWS * 4, [TB1] = KWK_QROWS * 4},
    .rows = {[TC0] = KWK_AMX_TOKS, [TC1] = KWK_AMX_TOKS, [TC2] = KWK_AMX_TOKS,
             [TC3] = KWK_AMX_TOKS, [TAH] = KWK_AMX_TOKS, [TAL] = KWK_AMX_TOKS,
             [TB0] = KWK_QACT_GROUP / 4, [TB1] = KWK_QACT_GROUP / 4},
};

/* A group's staged weights: B's 8 rows of 16 rows x 4 signed bytes. */
typedef int8_t stage_group[KWK_QACT_GROUP / 4][KWK_QROWS * 4];

/* Row block blk's groups [0, ng) of the pass as signed bytes. */
static void stage(int wtype, const void *blk, int ng, stage_group *st)
{
    if (wtype == KWK_W_Q8) {
        const __m512i flip = _mm512_set1_epi8((char)0x80); /* q - 128 = q ^ 0x80 as int8 */
        for (int g = 0; g < ng; g++)
            for (int k4 = 0; k4 < KWK_Q8_GROUP / 4; k4++) {
                __m512i q = _mm512_loadu_si512(((const struct kwk_q8_block *)blk)[g].q[k4]);
                _mm512_store_si512(st[g][k4], _mm512_xor_si512(q, flip));
            }
        return;
    }
    int q6 = wtype == KWK_W_Q6;
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    const __m512i off = _mm512_set1_epi8(q6 ? 32 : 0);
    for (int g = 0; g < ng; g++)
        for (int c = 0; c < KWK_Q4_GROUP / 8; c++) {
            __m512i lo, hi;
            nib_unpack(blk, q6, g, c, m4, m30, &lo, &hi);
            _mm512_store_si512(st[g][2 * c], _mm512_sub_epi8(lo, off));
            _mm512_store_si512(st[g][2 * c + 1], _mm512_sub_epi8(hi, off));
        }
}

/* The group's weight scales (and int4's offsets) as floats. */
KWK_INLINE void scales(int wtype, const void *blk, int g, __m512 *d, __m512 *m)
{
    const uint16_t *pd, *pm = NULL;
    if (wtype == KWK_W_Q8) {
        pd = ((const struct kwk_q8_block *)blk)[g].d;
    } else if (wtype == KWK_W_Q6) {
        pd = ((const struct kwk_q6_block *)blk)[g].d;
    } else {
        pd = ((const struct kwk_q4_block *)blk)[g].d;
        pm = ((const struct kwk_q4_block *)blk)[g].m;
    }
    *d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pd));
    if (pm)
        *m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pm));
}

/* Token t + j's numbers of group g (the VNNI tiles' XD / XS). */
#define XD(x, t, g) ((x)->d[(long)(t) * (x)->ldg + (g)])
#define XS(x, t, g) ((x)->s[(long)(t) * (x)->ldg + (g)])

/* The epilogue of group g for the tile's 16 tokens from t, on the stored C rows ch (and in
 * 16-bit mode cl): the VNNI tiles' operations, in their order (avx512_quant.c: tile_q8,
 * tile_nib, tile8_q8, tile8_nib). The 16 tokens' accumulators are named variables f0..f15 of
 * the enclosing tile, not an array: GCC keeps an array of 16 vectors in memory, a load and a
 * store around every FMA (SmolLM2-1.7B's int4 prompt 8% faster without them, session 35). */
#define EPI_TOKEN(j)                                                                               \
    do {                                                                                           \
        __m512i v_ = _mm512_load_si512(ch_ + KWK_QROWS * (j));                                     \
        if (!act8)                                                                                 \
            v_ = _mm512_add_epi32(_mm512_mullo_epi32(v_, _mm512_set1_epi32(254)),                  \
                                  _mm512_load_si512(cl_ + KWK_QROWS * (j)));                       \
        __m512 xd_ = _mm512_set1_ps(pd_[(long)(j) * ldg_]);                                        \
        f##j = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v_), _mm512_mul_ps(d_, xd_), f##j);              \
        if (wtype == KWK_W_Q4)                                                                     \
            f##j = _mm512_fmadd_ps(m_, _mm512_set1_ps(po_[(long)(j) * ldo_]), f##j);               \
    } while (0)
#define EPILOGUE(g, ch, cl)                                                                        \
    do {                                                                                           \
        __m512 d_, m_ = _mm512_setzero_ps();                                                       \
        scales(wtype, blk, (g), &d_, &m_);                                                         \
        const int32_t *ch_ = (ch), *cl_ = (cl);                                                    \
        long ldg_ = x->ldg, ldo_ = act8 ? ldg_ : ng;                                               \
        /* d_x, and int4's offset factor: d_x * sum(v) (act8: XM; 16-bit: ds) */                  \
        const float *pd_ = x->d + (long)t * ldg_ + (g);                                            \
        const float *po_ = act8 ? x->m + (long)t * ldg_ + (g) : ds + (g);                          \
        EPI_TOKEN(0); EPI_TOKEN(1); EPI_TOKEN(2); EPI_TOKEN(3);                                    \
        EPI_TOKEN(4); EPI_TOKEN(5); EPI_TOKEN(6); EPI_TOKEN(7);                                    \
        EPI_TOKEN(8); EPI_TOKEN(9); EPI_TOKEN(10); EPI_TOKEN(11);                                  \
        EPI_TOKEN(12); EPI_TOKEN(13); EPI_TOKEN(14); EPI_TOKEN(15);                                \
    } while (0)

/* Tile multiplies hand their sums to the vector epilogue only through memory, and tile registers
 * are not renamed, so the groups are software pipelined over four C tiles: with 8-bit
 * activations group i's multiply is issued two groups ahead of its store and the store one group
 * ahead of its epilogue; with 16-bit activations (two multiplies a group, a C pair each) one
 * group ahead of each. Measured on one thread of a Xeon with AMX (docs/benchmarks.md, session
 * 26): 4% faster than one group at a time; the tile work and the epilogue still take about the
 * sum of their times. A step's tile registers are constants, so each step is a case of a switch
 * on i % 4 (or i % 2), and the epilogue after it is one copy in the loop. */

/* Group i's multiply into C tile c with A tile a and B tile b (act8: one pass). */
#define MUL8(i, c, a, b)                                                                           \
    do {                                                                                           \
        _tile_loadd(b, st[i], KWK_QROWS * 4);                                                      \
        _tile_loadd(a, xh + (long)(i) * KWK_QACT_GROUP, x->ldh);                                   \
        _tile_zero(c);                                                                             \
        _tile_dpbssd(c, a, b);                                                                     \
        PF_STEP(i);                                                                                \
    } while (0)
/* Group i's two multiplies (high and low halves) into C tiles ch, cl with B tile b. */
#define MUL16(i, ch, cl, b)                                                                        \
    do {                                                                                           \
        _tile_loadd(b, st[i], KWK_QROWS * 4);                                                      \
        _tile_loadd(TAH, xh + (long)(i) * KWK_QACT_GROUP, x->ldh);                                 \
        _tile_loadd(TAL, xl + (long)(i) * KWK_QACT_GROUP, x->ldh);                                 \
        _tile_zero(ch);                                                                            \
        _tile_zero(cl);                                                                            \
        _tile_dpbssd(ch, TAH, b);                                                                  \
        _tile_dpbssd(cl, TAL, b);                                                                  \
        PF_STEP(i);                                                                                \
    } while (0)

/* Lines to prefetch into L2 during a tile: n lines from p, per at each group step. */
struct pf {
    const uint8_t *p;
    int n, per;
};

#define PF_STEP(i)                                                                                 \
    do {                                                                                           \
        for (int l_ = (i) * pf->per, e_ = KWK_MIN(pf->n, l_ + pf->per); l_ < e_; l_++)            \
            _mm_prefetch((const char *)pf->p + 64 * l_, _MM_HINT_T1);                              \
    } while (0)

/* 8-bit step i: multiply group i into C tile i % 4 (A, B tiles alternating), store group i - 2
 * (C tile (i - 2) % 4 to cb[(i - 2) % 4]). */
#define STEP8(k, c, a, b, cs)                                                                      \
    case k:                                                                                        \
        if (i < ng)                                                                                \
            MUL8(i, c, a, b);                                                                      \
        if (i >= 2 && i - 2 < ng)                                                                  \
            _tile_stored(cs, cb[(k + 2) % 4], KWK_QROWS * 4);                                      \
        break
/* 16-bit step i: multiply group i into C pair i % 2, store group i - 1 (pair (i - 1) % 2 to cb
 * pair (i - 1) % 2). */
#define STEP16(k, ch, cl, b, csh, csl)                                                             \
    case k:                                                                                        \
        if (i < ng)                                                                                \
            MUL16(i, ch, cl, b);                                                                   \
        if (i >= 1 && i - 1 < ng) {                                                                \
            _tile_stored(csh, cb[2 * ((k + 1) % 2)], KWK_QROWS * 4);                               \
            _tile_stored(csl, cb[2 * ((k + 1) % 2) + 1], KWK_QROWS * 4);                           \
        }                                                                                          \
        break

/* One tile: row block rb (blk its first block of the pass, st its staged weights), tokens
 * [t, t + 16) over the pass's ng groups. */
KWK_INLINE void tile(int wtype, int act8, const void *blk, const stage_group *st,
                     const struct kwk_qact *x, int t, int ng, const float *ds, float *y, long ldy,
                     int64_t rb, int64_t r0, int64_t r1, int first, const struct pf *pf)
{
    _Alignas(64) int32_t cb[4][KWK_AMX_TOKS * KWK_QROWS];
    __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0, f4 = f0, f5 = f0, f6 = f0,
           f7 = f0, f8 = f0, f9 = f0, f10 = f0, f11 = f0, f12 = f0, f13 = f0, f14 = f0, f15 = f0;
    const int8_t *xh = x->h + (long)t * x->ldh, *xl = x->l + (long)t * x->ldh;
    if (act8) {
        /* step i, then the epilogue of group i - 3 */
        for (int i = 0; i < ng + 3; i++) {
            switch (i & 3) {
                STEP8(0, TC0, TAH, TB0, TC2);
                STEP8(1, TC1, TAL, TB1, TC3);
                STEP8(2, TC2, TAH, TB0, TC0);
                STEP8(3, TC3, TAL, TB1, TC1);
            }
            if (i >= 3)
                EPILOGUE(i - 3, cb[(i - 3) & 3], NULL);
        }
    } else {
        /* step i, then the epilogue of group i - 2 */
        for (int i = 0; i < ng + 2; i++) {
            switch (i & 1) {
                STEP16(0, TC0, TC1, TB0, TC2, TC3);
                STEP16(1, TC2, TC3, TB1, TC0, TC1);
            }
            if (i >= 2)
                EPILOGUE(i - 2, cb[2 * (i & 1)], cb[2 * (i & 1) + 1]);
        }
    }
    const __m512 f[KWK_AMX_TOKS] = {f0, f1, f2,  f3,  f4,  f5,  f6,  f7,
                                    f8, f9, f10, f11, f12, f13, f14, f15};
    for (int j = 0; j < KWK_AMX_TOKS; j++)
        put(y + (long)(t + j) * ldy, rb, r0, r1, f[j], first);
}

/* One function per (format, activation mode), so that the epilogue's branches are constants. */
typedef void (*tile_fn)(const void *, const stage_group *, const struct kwk_qact *, int, int,
                        const float *, float *, long, int64_t, int64_t, int64_t, int,
                        const struct pf *);
#define TILE(NAME, WT, A8)                                                                         \
    static void NAME(const void *blk, const stage_group *st, const struct kwk_qact *x, int t,     \
                     int ng, const float *ds, float *y, long ldy, int64_t rb, int64_t r0,         \
                     int64_t r1, int first, const struct pf *pf)                                   \
    {                                                                                              \
        tile(WT, A8, blk, st, x, t, ng, ds, y, ldy, rb, r0, r1, first, pf);                        \
    }
TILE(tile_q8, KWK_W_Q8, 0)
TILE(tile_q4, KWK_W_Q4, 0)
TILE(tile_q6, KWK_W_Q6, 0)
TILE(tile8_q8, KWK_W_Q8, 1)
TILE(tile8_q4, KWK_W_Q4, 1)
TILE(tile8_q6, KWK_W_Q6, 1)

/* Tokens whose int4 offset factors (below) are computed at a time. */
#define DS_TOKS 128

void kwk_quant_pass_amx(const struct kwk_mat *w, const struct kwk_qact *x, int nt, int64_t g0,
                        int64_t g1, float *y, long ldy, int64_t r0, int64_t r1)
{
    _Alignas(64) stage_group st[KWK_QX_COLS / KWK_QACT_GROUP];
    /* int4 with 16-bit activations: each token's and group's d_x * (float)sum(v), the VNNI
     * tile's factor of the offset term, once for every row block instead of in each epilogue
     * (scalar work on the ports the epilogue needs; int4 act16 prompts 5-15% faster, session
     * 26) */
    float ds[DS_TOKS * (KWK_QX_COLS / KWK_QACT_GROUP)];
    int a8 = w->act8 != 0, ng = (int)(g1 - g0);
    tile_fn fn = w->wtype == KWK_W_Q8   ? (a8 ? tile8_q8 : tile_q8)
                 : w->wtype == KWK_W_Q6 ? (a8 ? tile8_q6 : tile_q6)
                                        : (a8 ? tile8_q4 : tile_q4);
    size_t bsz; /* one block: 16 rows x one group */
    kwk_quant_bytes(w->wtype, KWK_QROWS, KWK_QACT_GROUP, &bsz);
    int64_t ngt = kwk_quant_n_groups(w->wtype, w->cols);
    int64_t rb0 = r0 / KWK_QROWS, rb1 = (r1 + KWK_QROWS - 1) / KWK_QROWS;
    _tile_loadconfig(&TILE_CONFIG);
    for (int tc = 0; tc < nt; tc += DS_TOKS) {
        int tn = KWK_MIN(DS_TOKS, nt - tc);
        if (w->wtype == KWK_W_Q4 && !a8)
            for (int t = 0; t < tn; t++)
                for (int g = 0; g < ng; g++)
                    ds[t * ng + g] = XD(x, tc + t, g) * (float)XS(x, tc + t, g);
        /* The next row block's weights are prefetched into L2 during this one's tiles, a few
         * lines at each group step: staging otherwise waits on memory at every row block (half
         * of this function's own time in a profile of SmolLM2-1.7B's int4 prompt), since a row
         * block's ng blocks are a short run the hardware prefetchers do not run ahead of; all of
         * them at once at the start of a tile fill the line-fill buffers and stall the core
         * there instead. 3-5% of that prompt (session 35). */
        size_t lines = ((size_t)ng * bsz + 63) / 64;
        int ntile = (tn + KWK_AMX_TOKS - 1) / KWK_AMX_TOKS;
        int per_tile = (int)((lines + ntile - 1) / ntile);
        for (int64_t rb = rb0; rb < rb1; rb++) {
            const uint8_t *blk = (const uint8_t *)w->data + (size_t)(rb * ngt + g0) * bsz;
            const uint8_t *next = rb + 1 < rb1 ? blk + (size_t)ngt * bsz : NULL;
            stage(w->wtype, blk, ng, st);
            /* GCC's tileloadd is an asm without a memory operand: the staged stores must not
             * be moved past it or dropped */
            __asm__ volatile("" ::: "memory");
            for (int t = tc, i = 0; t < tc + tn; t += KWK_AMX_TOKS, i++) {
                struct pf pf = {NULL, 0, 0};
                if (next) {
                    long l0 = (long)i * per_tile, l1 = KWK_MIN((long)lines, l0 + per_tile);
                    if (l1 > l0)
                        pf = (struct pf){next + 64 * l0, (int)(l1 - l0),
                                         (int)((l1 - l0 + ng - 1) / ng)};
                }
                fn(blk, st, x, t, ng, ds + (t - tc) * ng, y, ldy, rb, r0, r1, g0 == 0, &pf);
            }
        }
    }
    /* back to the initial state: a thread that holds no tile data costs no 8 KiB at a
     * context switch */
    _tile_release();
}
