/* amx_attn.h - the tile multiplies of the AMX attention table (kwk_attn_amx_bf16, whose tiles
 * live in avx512_attn.c): key blocks' scores and weighted values, in bf16 products summed in
 * float. Include only from files compiled with AVX-512; call only where
 * kwk_cpu_amx_bf16(), between kwk_attn_amx_begin() and kwk_attn_amx_end() on the same thread. */
#ifndef KWK_AMX_ATTN_H
#define KWK_AMX_ATTN_H

#include <stdint.h>

/* Loads the tile configuration of the functions below; releases the tile state. */
void kwk_attn_amx_begin(void);
void kwk_attn_amx_end(void);
/* Cuts the tiles kwk_attn_amx_values multiplies to its first m queries (1..16) until the next
 * kwk_attn_amx_begin (which loads the full tiles; the tiles' contents are lost either way): a
 * multiply's time follows its rows (the values kernel from L2, session 38: 13 TSC ticks a
 * multiply with 1-4 rows, 17.5 with 8, 22 with 16; a configuration load costs about 130), and an
 * element depends only on its own row and column, so the m queries' sums are the same bits. */
void kwk_attn_amx_values_rows(int m);

/* s[u * 16 + x] = the dot product of key u (bf16 row k + u * ldk, hd elements) and query x
 * (qt[p * 16 + x]: elements 2p, 2p + 1 of query x as a pair of bf16), for nb blocks of 16 keys
 * (nb 1..4, 16 * nb keys) and 16 queries; hd a multiple of 32. Each sum runs over the
 * 32-element chunks in order and depends only on its key and query, never on the others. */
void kwk_attn_amx_scores(const uint32_t *qt, const uint16_t *k, long ldk, int hd, int nb,
                         float *s);

/* kwk_attn_amx_scores over nb blocks of 16 keys (any count) for head dims of one or two 32-element
 * chunks (hd 32 or 64), block i's 16 x 16 scores at s + i * 256: the same sums, bitwise. The
 * queries' chunks stay in their tiles and each block has its own accumulator in turn (four), so
 * a block's multiplies and store overlap the next blocks' instead of waiting on them (16 TSC
 * ticks a multiply from L2, the multiplies' own rate; kwk_attn_amx_scores' calls of 4 blocks,
 * each waiting for its stores, spent about twice that in a decode step, session 38). */
void kwk_attn_amx_scores_run(const uint32_t *qt, const uint16_t *k, long ldk, int hd, int nb,
                             float *s);

/* The weighted values of 16 queries x (or of the first m, read and written alone, after
 * kwk_attn_amx_values_rows(m)) and 32 * nch elements (nch 1 or 2), over keys j < nk (a
 * multiple of 16): acc[2c][x * 16 + n] += sum over j of w(x, j) * v(j, 32c + 2n), and
 * acc[2c + 1][...] the same of element 32c + 2n + 1. v(j, e) = v[j * ldv + e], bf16 rows; the
 * weight w(x, j) rounded to bf16 is given twice, rows ldw apart: wo[x * ldw + j] as a float (its
 * bf16 in the high half) and we[...] with it in the low half (its bits >> 16); every weight of
 * keys a query does not attend zero. Each sum runs over the 16-key blocks in order, from acc
 * (read and written as 16 (or m) x 16 floats), or from zero if fresh (acc then written only: a tile
 * load right after the stores of zeros would wait for them). */
void kwk_attn_amx_values(const float *wo, const float *we, long ldw, const uint16_t *v, long ldv,
                         int nch, int nk, int fresh, float (*acc)[256]);

#endif
