/* amx_attn.c - the products of the AMX attention table on AMX-BF16 (Intel Xeon since Sapphire
 * Rapids): tdpbf16ps sums 16 x 16 x 32 bf16 products in float in one instruction where
 * vdpbf16ps does 16 x 2. The tiles around these products (which queries and keys, the softmax,
 * rounding and staging) are avx512_attn.c's. Pure functions; any thread, between
 * kwk_attn_amx_begin and kwk_attn_amx_end on it. Only called where kwk_cpu_amx_bf16().
 *
 * Scores: A is a block of 16 keys (32 elements each a multiply, as they lie in the cache), B the
 * tile's 16 queries as element pairs (the transposed queries the vector table's lane path
 * builds), C 16 keys x 16 queries. Values: B is 16 value rows of 32 elements as they lie in the
 * cache, which the multiply reads as 16 pairs (elements 2n, 2n + 1) of each row; A holds 16
 * queries' weights of those 16 keys, each in one slot of its pair and zero in the other, so one
 * multiply yields the even elements (C 16 queries x 16 of them) and another, with the weights
 * in the other slot, the odd ones. Twice the multiplies of pairing the keys, but values read as
 * they are stored: pairing keys meant interleaving two value rows in memory first, and a tile
 * load waits for such fresh stores (a decode step's attention at 500 positions: 19.5 us with the
 * interleaving, 12.5 without, 17 on AVX-512 alone; docs/benchmarks.md, session 27). A C
 * element's sum depends only on its own A row and B column and the order of the multiplies,
 * never on the other rows and columns of the tile: that is the table's batch invariance. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/amx_attn.h"
#include "kernels/amx_tiles16.h"

/* Alternating the A and B registers (amx_tiles16.h) gained 4% on a decode row at 500 positions
 * and nothing on prompt chunks (one register each ran those 2-3% faster), since a tile's loads
 * are few beside its multiplies and stores. */

void kwk_attn_amx_begin(void)
{
    _tile_loadconfig(&TILES16_CONFIG);
}

void kwk_attn_amx_end(void)
{
    _tile_release();
}

/* TILES16_CONFIG with the C and A tiles (registers 0-5) cut to m rows: the values' tiles of m
 * queries (kwk_attn_amx_values_rows). */
#define ROWS_CONFIG(m)                                                                             \
    {                                                                                              \
        .palette = 1, .colsb = {64, 64, 64, 64, 64, 64, 64, 64},                                   \
        .rows = {m, m, m, m, m, m, 16, 16},                                                        \
    }
static const _Alignas(64) struct kwk_amx_config ROWS_CONFIGS[16] = {
    ROWS_CONFIG(1),  ROWS_CONFIG(2),  ROWS_CONFIG(3),  ROWS_CONFIG(4),
    ROWS_CONFIG(5),  ROWS_CONFIG(6),  ROWS_CONFIG(7),  ROWS_CONFIG(8),
    ROWS_CONFIG(9),  ROWS_CONFIG(10), ROWS_CONFIG(11), ROWS_CONFIG(12),
    ROWS_CONFIG(13), ROWS_CONFIG(14), ROWS_CONFIG(15), ROWS_CONFIG(16)};

void kwk_attn_amx_values_rows(int m)
{
    _tile_loadconfig(&ROWS_CONFIGS[m < 1 ? 0 : m > 16 ? 15 : m - 1]);
}

/* Block i's share of chunk c: its keys' 32 elements into A (alternate registers), multiplied
 * by the queries' chunk in B. */
#define SCORES_BLOCK(T, TA, TB, i)                                                                 \
    do {                                                                                           \
        _tile_loadd(TA, k + (long)(i) * 16 * ldk + 32 * c, ldk * (long)sizeof *k);                 \
        _tile_dpbf16ps(T, TA, TB);                                                                 \
    } while (0)

/* Chunk c of every block, the queries' chunk loaded into TB. */
#define SCORES_CHUNK(TB)                                                                           \
    do {                                                                                           \
        _tile_loadd(TB, qt + 256 * c, 64);                                                         \
        SCORES_BLOCK(TC0, TA0, TB, 0);                                                             \
        if (nb > 1)                                                                                \
            SCORES_BLOCK(TC1, TA1, TB, 1);                                                         \
        if (nb > 2)                                                                                \
            SCORES_BLOCK(TC2, TA0, TB, 2);                                                         \
        if (nb > 3)                                                                                \
            SCORES_BLOCK(TC3, TA1, TB, 3);                                                         \
    } while (0)

void kwk_attn_amx_scores(const uint32_t *qt, const uint16_t *k, long ldk, int hd, int nb,
                         float *s)
{
    /* GCC's tile loads and stores are asm without memory operands: keep the caller's stores of
     * the operands before them and its loads of s after */
    __asm__ volatile("" ::: "memory");
    /* several blocks in flight: one block's chain of multiplies, its store and the caller's
     * loads would each wait on the one before */
    _tile_zero(TC0);
    _tile_zero(TC1);
    _tile_zero(TC2);
    _tile_zero(TC3);
    for (int c = 0; c < hd / 32; c++) {
        if (c & 1)
            SCORES_CHUNK(TB1);
        else
            SCORES_CHUNK(TB0);
    }
    _tile_stored(TC0, s, 64);
    if (nb > 1)
        _tile_stored(TC1, s + 256, 64);
    if (nb > 2)
        _tile_stored(TC2, s + 512, 64);
    if (nb > 3)
        _tile_stored(TC3, s + 768, 64);
    __asm__ volatile("" ::: "memory");
}

/* Block i of kwk_attn_amx_scores_run into accumulator T: zeroed, then its keys' chunks times the
 * queries' (TB0, TB1), stored. */
#define RUN_BLOCK(T, i)                                                                            \
    do {                                                                                           \
        _tile_zero(T);                                                                             \
        _tile_loadd(TA0, k + (long)(i) * 16 * ldk, ldk * (long)sizeof *k);                         \
        _tile_dpbf16ps(T, TA0, TB0);                                                               \
        if (hd > 32) {                                                                             \
            _tile_loadd(TA1, k + (long)(i) * 16 * ldk + 32, ldk * (long)sizeof *k);                \
            _tile_dpbf16ps(T, TA1, TB1);                                                           \
        }                                                                                          \
        _tile_stored(T, s + (long)(i) * 256, 64);                                                  \
    } while (0)

void kwk_attn_amx_scores_run(const uint32_t *qt, const uint16_t *k, long ldk, int hd, int nb,
                             float *s)
{
    __asm__ volatile("" ::: "memory");
    _tile_loadd(TB0, qt, 64);
    if (hd > 32)
        _tile_loadd(TB1, qt + 256, 64);
    int i = 0;
    for (; i + 4 <= nb; i += 4) {
        RUN_BLOCK(TC0, i);
        RUN_BLOCK(TC1, i + 1);
        RUN_BLOCK(TC2, i + 2);
        RUN_BLOCK(TC3, i + 3);
    }
    if (i < nb)
        RUN_BLOCK(TC0, i);
    if (i + 1 < nb)
        RUN_BLOCK(TC1, i + 1);
    if (i + 2 < nb)
        RUN_BLOCK(TC2, i + 2);
    __asm__ volatile("" ::: "memory");
}

/* Chunk c's share of a block: its 16 keys' 32 elements into B (alternate registers), times the
 * weights in their even (TA1) and odd (TA0) slots. */
#define VALUES_CHUNK(TE, TO, TB, c)                                                                \
    do {                                                                                           \
        _tile_loadd(TB, v + (long)j * ldv + 32 * (c), ldv * 2);                                    \
        _tile_dpbf16ps(TE, TA1, TB);                                                               \
        _tile_dpbf16ps(TO, TA0, TB);                                                               \
    } while (0)

void kwk_attn_amx_values(const float *wo, const float *we, long ldw, const uint16_t *v, long ldv,
                         int nch, int nk, int fresh, float (*acc)[256])
{
    __asm__ volatile("" ::: "memory");
    if (fresh) {
        _tile_zero(TC0);
        _tile_zero(TC1);
        _tile_zero(TC2);
        _tile_zero(TC3);
    } else {
        _tile_loadd(TC0, acc[0], 64);
        _tile_loadd(TC1, acc[1], 64);
        if (nch > 1) {
            _tile_loadd(TC2, acc[2], 64);
            _tile_loadd(TC3, acc[3], 64);
        }
    }
    for (int j = 0; j < nk; j += 16) {
        _tile_loadd(TA0, wo + j, ldw * 4);
        _tile_loadd(TA1, we + j, ldw * 4);
        VALUES_CHUNK(TC0, TC1, TB0, 0);
        if (nch > 1)
            VALUES_CHUNK(TC2, TC3, TB1, 1);
    }
    _tile_stored(TC0, acc[0], 64);
    _tile_stored(TC1, acc[1], 64);
    if (nch > 1) {
        _tile_stored(TC2, acc[2], 64);
        _tile_stored(TC3, acc[3], 64);
    }
    __asm__ volatile("" ::: "memory");
}
