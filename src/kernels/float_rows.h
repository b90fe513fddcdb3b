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

/* Where a decode tile (one token, a full tile of rows_per_tile rows at r) prefetches: the next
 * tile's rows, into next[0..rows_per_tile) (avx512.c; avx2.c's decode reads long runs of rows
 * instead, its comment says why). Decode reads a tile's rows side by side: short
 * streams (a row of SmolLM2-360M is 1920 bytes in bf16) that end about when the hardware
 * prefetcher has learnt them, so the tile asks for the next tile's rows line by line as it goes
 * (360M preserve generation +39% AVX-512, +56% AVX2). Returns 0, and next[] = the tile's own
 * rows, when there is no next full tile or the tile is not a decode tile. */
static inline __attribute__((always_inline)) int kwk_next_rows(const struct kwk_mat *w, int64_t r,
                                                               int R, int T, int rows_per_tile,
                                                               int wt, const char **next)
{
    int ahead = T == 1 && R == rows_per_tile && r + 2 * rows_per_tile <= w->rows;
    for (int i = 0; i < R; i++)
        next[i] = (const char *)kwk_row_ptr(w, ahead ? r + rows_per_tile + i : r + i, wt);
    return ahead;
}

/* One function per (R, T) of a file's tile(): R, T and the weight type are constants inside, so
 * the accumulators stay in registers; tile_fn is their type. */
#define TILE_FN(R, T, WT, NAME)                                                                    \
    static void tile_##NAME##_##R##_##T(const struct kwk_mat *w, const float *x, float *y,         \
                                        long ldy, int64_t r, int t, int64_t k0, int64_t k1,        \
                                        int first, int pf_l2)                                      \
    {                                                                                              \
        tile(w, x, y, ldy, r, t, k0, k1, first, pf_l2, R, T, WT);                                  \
    }

typedef void (*tile_fn)(const struct kwk_mat *, const float *, float *, long, int64_t, int, int64_t,
                        int64_t, int, int);

#endif
