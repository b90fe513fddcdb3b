/* avx2_panel.c - the bf16 panel matmul (panel.h) with AVX2 + FMA: rows in the lanes, tokens
 * broadcast. Pure functions; any thread. Bitwise panel_ref.c's numbers: each (row, token) is
 * one FMA chain a pass, from +0, in column order, and the passes add up in order. */
#include <immintrin.h>

#include "base/base.h"
#include "kernels/panel.h"

#define INLINE static inline __attribute__((always_inline))

#define P KWK_PANEL_ROWS
#define KC KWK_PANEL_KC
/* Prompt tile: one panel (two vectors of 8 rows) x PT tokens = 12 accumulators, plus the two
 * weight vectors, a broadcast and the mask: the 16 ymm registers. */
#define PT 6
/* Tokens a block: their pass of activations (PTB KiB) stays in L1 beside the panel's 8 KiB.
 * Zen 3, one thread, 512 tokens, GFLOP/s on 2560x960 / 960x2560 / 576x1536: 12 tokens 87-91,
 * 24 90-91, 48 73-79, 96 77-90 (a separate harness, session 16). */
#define PTB 24

/* Column k of a panel as rows 0-7 and rows 8-15, exactly widened to float32. */
INLINE void ld_panel(const uint16_t *pk, __m256i mask, __m256 *lo, __m256 *hi)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)pk);
    *lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *hi = _mm256_castsi256_ps(_mm256_and_si256(v, mask));
}

/* A pass's sums s of 16 rows into out (first pass: out = s, else out + s). */
INLINE void put16(float *out, __m256 s0, __m256 s1, int first)
{
    if (!first) {
        s0 = _mm256_add_ps(_mm256_loadu_ps(out), s0);
        s1 = _mm256_add_ps(_mm256_loadu_ps(out + 8), s1);
    }
    _mm256_storeu_ps(out, s0);
    _mm256_storeu_ps(out + 8, s1);
}

/* ---- prompt: T tokens (1..PT) of one panel over columns [k0, k1): token j's 16 sums go to
 * out + j * ldo. pk is the panel's column k0, x token 0's element k0 (tokens ldx apart). pf,
 * when not NULL, is the start of n panel columns to prefetch into L1, a line every two columns. */
INLINE void tile(const uint16_t *pk, const float *x, long ldx, int64_t n, float *out, long ldo,
                 int first, const char *pf, int T)
{
    const __m256i mask = _mm256_set1_epi32((int)0xffff0000u);
    __m256 a0[PT], a1[PT];
#pragma GCC unroll 8
    for (int j = 0; j < T; j++)
        a0[j] = a1[j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < n; k++, pk += P) {
        __m256 lo, hi;
        if (pf && (k & 1) == 0)
            _mm_prefetch(pf + 32 * k, _MM_HINT_T0);
        ld_panel(pk, mask, &lo, &hi);
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            __m256 xb = _mm256_broadcast_ss(x + j * ldx + k);
            a0[j] = _mm256_fmadd_ps(lo, xb, a0[j]);
            a1[j] = _mm256_fmadd_ps(hi, xb, a1[j]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < T; j++)
        put16(out + j * ldo, a0[j], a1[j], first);
}

typedef void (*tile_fn)(const uint16_t *, const float *, long, int64_t, float *, long, int,
                        const char *);
#define TILE(T)                                                                                  \
    static void tile_##T(const uint16_t *pk, const float *x, long ldx, int64_t n, float *out,  \
                         long ldo, int first, const char *pf)                                    \
    {                                                                                            \
        tile(pk, x, ldx, n, out, ldo, first, pf, T);                                             \
    }
TILE(1)
TILE(2)
TILE(3)
TILE(4)
TILE(5)
TILE(6)
static const tile_fn tiles[PT + 1] = {NULL, tile_1, tile_2, tile_3, tile_4, tile_5, tile_6};
_Static_assert(PT == 6, "tiles[] lists 1 to 6 tokens");

static const uint16_t *panel_col(const struct kwk_mat *w, int64_t p, int64_t k)
{
    return (const uint16_t *)w->data + ((size_t)p * (size_t)w->cols + (size_t)k) * P;
}

/* Tokens [t0, t1) of panel p over columns [k0, k1): whole panels inside [r0, r1) straight into
 * y, a panel cut by the range through a buffer (rows outside it stay untouched). */
static void panel_tokens(const struct kwk_mat *w, const float *x, int t0, int t1, float *y,
                         long ldy, int64_t p, int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                         const char *next)
{
    const uint16_t *pk = panel_col(w, p, k0);
    long ldx = (long)w->cols;
    int64_t lo = KWK_MAX(r0, p * P), hi = KWK_MIN(r1, p * P + P);
    int first = k0 == 0;
    for (int t = t0; t < t1; t += PT) {
        int T = KWK_MIN(PT, t1 - t);
        const float *xt = x + (size_t)t * (size_t)ldx + k0;
        const char *pf = t == t0 ? next : NULL;
        if (hi - lo == P) {
            tiles[T](pk, xt, ldx, k1 - k0, y + (int64_t)t * ldy + p * P, ldy, first, pf);
            continue;
        }
        float buf[PT][P];
        tiles[T](pk, xt, ldx, k1 - k0, &buf[0][0], P, 1, pf);
        for (int j = 0; j < T; j++)
            for (int64_t r = lo; r < hi; r++) {
                float *yr = y + (int64_t)(t + j) * ldy + r;
                *yr = first ? buf[j][r - p * P] : *yr + buf[j][r - p * P];
            }
    }
}

/* Loop order: token blocks (their pass of activations in L1), passes, panels (a panel's pass
 * in L1 across the block's token tiles), token tiles. */
static void gemm(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                 int64_t r0, int64_t r1)
{
    int64_t cols = w->cols, p0 = r0 / P, p1 = (r1 + P - 1) / P;
    for (int tb = 0; tb < n_tok; tb += PTB) {
        int te = KWK_MIN(n_tok, tb + PTB);
        for (int64_t k0 = 0; k0 < cols; k0 += KC)
            for (int64_t p = p0; p < p1; p++) {
                /* The next panel's pass (or the next pass's first panel), prefetched by the
                 * block's first token tile: a panel's pass is 8 KiB a panel's width apart from
                 * the next, a run the hardware prefetchers do not start ahead of (SmolLM2-135M
                 * preserve on AVX2 alone: prompts 3-4% faster, session 35). Only a pass as
                 * wide as this one, so that the prefetches stay inside the matrix. */
                int64_t np = p + 1 < p1 ? p + 1 : p0, nk = p + 1 < p1 ? k0 : k0 + KC;
                int64_t k1 = KWK_MIN(cols, k0 + KC);
                const char *next = nk < cols && KWK_MIN(cols, nk + KC) - nk == k1 - k0
                                       ? (const char *)panel_col(w, np, nk)
                                       : NULL;
                panel_tokens(w, x, tb, te, y, ldy, p, r0, r1, k0, k1, next);
            }
    }
}

/* ---- decode: one token, memory-bound. The thread's whole panels lie contiguous; they are cut
 * into DEC_STREAMS runs and each step takes the next column of one panel of every run, so the
 * matrix is read as long sequential streams, each prefetched DEC_PF_BYTES ahead (avx2.c's float
 * decode does the same with rows). Zen 3, one thread, 2560x960 / 960x2560 / 1536x576, GB/s
 * (a separate harness): 4 runs 20-21 (1 KiB ahead 23.5-24, none 21-23.5), 2 runs 23-24, 8 runs
 * 15-21, where the row-major bf16 decode read 18 in the same minutes. */
#define DEC_STREAMS 4 /* kwk_kernels.dec_runs of the tables that use this decode */
#define DEC_PF_BYTES 1024

INLINE void dec_panels(const struct kwk_mat *w, const float *x, float *y, int64_t p, int64_t run,
                       int64_t end, int R)
{
    const __m256i mask = _mm256_set1_epi32((int)0xffff0000u);
    const uint16_t *wp[DEC_STREAMS];
    const char *stop[DEC_STREAMS];
    int64_t cols = w->cols;
#pragma GCC unroll 4
    for (int s = 0; s < R; s++) {
        wp[s] = panel_col(w, p + s * run, 0);
        /* the stream's last byte: prefetches stay inside it */
        int64_t last = s + 1 < R ? p + (s + 1) * run : end;
        stop[s] = (const char *)panel_col(w, last, 0);
    }
    for (int64_t k0 = 0; k0 < cols; k0 += KC) {
        int64_t k1 = KWK_MIN(cols, k0 + KC);
        __m256 a0[DEC_STREAMS], a1[DEC_STREAMS];
#pragma GCC unroll 4
        for (int s = 0; s < R; s++)
            a0[s] = a1[s] = _mm256_setzero_ps();
        for (int64_t k = k0; k < k1; k++) {
            if ((k & 1) == 0) /* a 64-byte line a stream */
#pragma GCC unroll 4
                for (int s = 0; s < R; s++) {
                    /* compared as a distance: no pointer is formed past the stream */
                    const char *at = (const char *)(wp[s] + (size_t)k * P);
                    if (stop[s] - at > DEC_PF_BYTES)
                        _mm_prefetch(at + DEC_PF_BYTES, _MM_HINT_T0);
                }
            __m256 xb = _mm256_broadcast_ss(x + k);
#pragma GCC unroll 4
            for (int s = 0; s < R; s++) {
                __m256 lo, hi;
                ld_panel(wp[s] + (size_t)k * P, mask, &lo, &hi);
                a0[s] = _mm256_fmadd_ps(lo, xb, a0[s]);
                a1[s] = _mm256_fmadd_ps(hi, xb, a1[s]);
            }
        }
#pragma GCC unroll 4
        for (int s = 0; s < R; s++)
            put16(y + (p + s * run) * P, a0[s], a1[s], k0 == 0);
    }
}

static void dec_4(const struct kwk_mat *w, const float *x, float *y, int64_t p, int64_t run,
                  int64_t end)
{
    dec_panels(w, x, y, p, run, end, DEC_STREAMS);
}

static void dec_1(const struct kwk_mat *w, const float *x, float *y, int64_t p, int64_t run,
                  int64_t end)
{
    dec_panels(w, x, y, p, run, end, 1);
}
_Static_assert(DEC_STREAMS == 4, "dec_4 takes 4 streams");

/* Whole panels [q0, q1) of one token. */
static void dec_gemm(const struct kwk_mat *w, const float *x, float *y, int64_t q0, int64_t q1)
{
    int64_t run = (q1 - q0) / DEC_STREAMS, rest = q0 + DEC_STREAMS * run;
    for (int64_t i = 0; i < run; i++)
        dec_4(w, x, y, q0 + i, run, rest);
    for (int64_t p = rest; p < q1; p++)
        dec_1(w, x, y, p, 1, q1);
}

void kwk_panel_matmul_avx2(const struct kwk_mat *w, const float *x, int n_tok, float *y,
                           long ldy, int64_t r0, int64_t r1)
{
    if (n_tok != 1) {
        gemm(w, x, n_tok, y, ldy, r0, r1);
        return;
    }
    /* the whole panels inside [r0, r1) stream; a panel the range cuts goes through a buffer */
    int64_t q0 = (r0 + P - 1) / P, q1 = r1 / P;
    if (q1 <= q0) {
        gemm(w, x, 1, y, ldy, r0, r1);
        return;
    }
    if (r0 < q0 * P)
        gemm(w, x, 1, y, ldy, r0, q0 * P);
    dec_gemm(w, x, y, q0, q1);
    if (q1 * P < r1)
        gemm(w, x, 1, y, ldy, q1 * P, r1);
}
