/* panel.h - bf16 weights in 16-row panels (KWK_W_BF16P): the layout preserve packs for the
 * AVX2 kernels, and the order every table sums it in.
 *
 * Why: a row-major matrix is multiplied as dot products (8 columns in the lanes of a vector,
 * summed across lanes at the end), so each multiply needs a vector of activations too: a prompt
 * tile of 3 rows x 4 tokens loads 7 vectors for 12 FMAs, the 4 activation rows from L2, and on
 * Zen 3 runs at 57-63 GFLOP/s a thread for 512 tokens. Stored as panels, the 16 rows' weights of
 * one column are contiguous: one load gives two vectors of 8 rows, each token's activation is
 * one broadcast, and a tile of 16 rows x 6 tokens does 12 FMAs for 1 load + 6 broadcasts with
 * rows in the lanes (nothing to sum across): 83-91 GFLOP/s (see docs/benchmarks.md, session 16).
 *
 * Layout: data is [ceil(rows/16)][cols][16] uint16_t. Panel p holds rows 16p .. 16p+15; for
 * column k its 16 halves are 8 32-bit words, word i = row 16p+i in its low half and row
 * 16p+8+i in its high half, so that a 256-bit load shifted left by 16 is rows 0-7 as float32
 * and the same load masked with 0xffff0000 is rows 8-15 (both exact). Rows past `rows` are 0.
 *
 * Sum order (every table, bitwise): y[t][r] over passes of KWK_PANEL_KC columns, in order;
 * within a pass s = +0.0f, then s = fmaf(w[r][k], x[t][k], s) column by column; the first
 * pass's s is y, each later one y = y + s. One token or many, any row range: the same numbers
 * (kernels.h's batch invariance), and the scalar table's are the AVX2 table's. */
#ifndef KWK_PANEL_H
#define KWK_PANEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#define KWK_PANEL_ROWS 16
/* Columns a pass: a pass's 16-row slice (8 KiB) stays in L1 across the prompt's token tiles.
 * Each row sums 256 products in a chain before the passes add up: as long a chain as the row-
 * major kernels' (2048-column passes over 8 lanes). */
#define KWK_PANEL_KC 256

/* Bytes of a rows x cols matrix in panels; -1 (and 0) on overflow or a negative size. */
int kwk_panel_bytes(int64_t rows, int64_t cols, size_t *out);
/* Panel p (rows 16p .. 16p+15) of a rows x cols matrix into data (the whole matrix's panels)
 * from float rows src[i*ld + k] (i < min(16, rows - 16p)), each exactly a bf16 value (the low
 * 16 bits of each float are dropped; the rest of the panel is zero). */
void kwk_panel_pack_rows(void *data, int64_t rows, int64_t cols, int64_t p, const float *src,
                         long ld);

/* The tables' matmul and mat_row for KWK_W_BF16P (kernels.h's contract): the scalar
 * specification and the AVX2 kernels (also the AVX-512 table's: AVX-512 hosts have AVX2). */
void kwk_panel_matmul_ref(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                          int64_t r0, int64_t r1);
void kwk_panel_mat_row(const struct kwk_mat *w, int64_t r, float *out);
void kwk_panel_matmul_avx2(const struct kwk_mat *w, const float *x, int n_tok, float *y,
                           long ldy, int64_t r0, int64_t r1);

#endif
