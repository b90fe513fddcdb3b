/* float_rows.h - rows of a plain (f32 / f16 / bf16) matrix as the float tiles of avx2.c and
 * avx512.c address them. Header-only (each ISA file compiles it with its own flags). */
#ifndef KWK_FLOAT_ROWS_H
#define KWK_FLOAT_ROWS_H

#include "kernels/kernels.h"

/* Bytes of one element of a plain wtype. */
static inline __attribute__((always_inline)) size_t kwk_wt_bytes(int wt)
{
    return wt == KWK_W_F32 ? 4 : 2;
}

/* Row r of w. */
static inline __attribute__((always_inline)) const void *kwk_row_ptr(const struct kwk_mat *w,
                                                                     int64_t r, int wt)
{
    return (const uint8_t *)w->data + (size_t)r * (size_t)w->cols * kwk_wt_bytes(wt);
}

/* One function per (R, T) of a file's tile(): R, T and the weight type are constants inside, so
 * the accumulators stay in registers; tile_fn is their type. */
#define TILE_FN(R, T, WT, NAME)                                                                    \
    static void tile_##NAME##_##R##_##T(const struct kwk_mat *w, const float *x, float *y,         \
                                        long ldy, int64_t r, int t, int64_t k0, int64_t k1,        \
                                        int first)                                                 \
    {                                                                                              \
        tile(w, x, y, ldy, r, t, k0, k1, first, R, T, WT);                                         \
    }

typedef void (*tile_fn)(const struct kwk_mat *, const float *, float *, long, int64_t, int, int64_t,
                        int64_t, int);

/* ---- decode (one token): a thread's rows [r0, r1) cut into KWK_DEC_STREAMS runs of
 * consecutive rows, each step taking the next row of every run, so the matrix is read as long
 * sequential streams, each prefetched KWK_DEC_PF_BYTES ahead (avx2.c and avx512.c say what they
 * measured). Each file defines dec_rows(w, x, y, r, run, end, pf_l2, R, wt): rows r + i * run,
 * i < R, the last stream ending at row end. */
#define KWK_DEC_STREAMS 4
#define KWK_DEC_PF_BYTES 2048

/* The R streams' first rows (wr) and their last bytes (stop: prefetches stay inside). */
static inline __attribute__((always_inline)) void kwk_dec_streams(const struct kwk_mat *w,
                                                                  int64_t r, int64_t run,
                                                                  int64_t end, int R, int wt,
                                                                  const char **wr,
                                                                  const char **stop)
{
    size_t row_bytes = (size_t)w->cols * kwk_wt_bytes(wt);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        wr[i] = kwk_row_ptr(w, r + i * run, wt);
        int64_t last = i + 1 < R ? r + (i + 1) * run : end;
        stop[i] = (const char *)kwk_row_ptr(w, last - 1, wt) + row_bytes;
    }
}

/* At column k: each stream's line KWK_DEC_PF_BYTES ahead, once a 64-byte line a row. */
static inline __attribute__((always_inline)) void kwk_dec_prefetch(const char *const *wr,
                                                                   const char *const *stop,
                                                                   int R, int64_t k, size_t esz,
                                                                   int pf_l2)
{
    if (((uint64_t)k * esz) & 63) /* not the start of a 64-byte line */
        return;
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        const char *p = wr[i] + k * (int64_t)esz;
        if (stop[i] - p > KWK_DEC_PF_BYTES)
            kwk_prefetch(p + KWK_DEC_PF_BYTES, pf_l2);
    }
}

typedef void (*dec_fn)(const struct kwk_mat *, const float *, float *, int64_t, int64_t, int64_t,
                       int);
/* One function per (R, weight type) of a file's dec_rows: 4 streams, and 1 for the rest. */
#define DEC_FN(R, WT, NAME)                                                                      \
    static void dec_##NAME##_##R(const struct kwk_mat *w, const float *x, float *y, int64_t r,    \
                                 int64_t run, int64_t end, int pf_l2)                            \
    {                                                                                            \
        dec_rows(w, x, y, r, run, end, pf_l2, R, WT);                                            \
    }
#define DECS_FOR(WT, NAME)                                                                       \
    DEC_FN(1, WT, NAME) DEC_FN(4, WT, NAME)                                                      \
    static const dec_fn decs_##NAME[2] = {dec_##NAME##_1, dec_##NAME##_4};
_Static_assert(KWK_DEC_STREAMS == 4, "DECS_FOR makes 1 and 4 streams");

/* y[r0, r1) of one token through decs (DECS_FOR). */
static inline void kwk_dec_gemm(const struct kwk_mat *w, const float *x, float *y, int64_t r0,
                                int64_t r1, const dec_fn decs[2])
{
    int pf_l2 = kwk_cpu_prefetch_l2();
    int64_t run = (r1 - r0) / KWK_DEC_STREAMS;
    for (int64_t i = 0; i < run; i++)
        decs[1](w, x, y, r0 + i, run, r0 + KWK_DEC_STREAMS * run, pf_l2);
    for (int64_t r = r0 + KWK_DEC_STREAMS * run; r < r1; r++) /* the rest, one stream each */
        decs[0](w, x, y, r, 1, r1, pf_l2);
}

#endif
