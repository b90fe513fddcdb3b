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

#endif
