/* amx_tiles16.h - the tile layout amx_attn.c and amx_bf16.c share: eight tiles of 16 rows x 64
 * bytes (16 floats, 32 bf16), registers 0-3 C, 4-5 A and 6-7 B. Consecutive multiplies take
 * their operands from alternate A and B registers, so that a load need not wait until the
 * multiply before has read its register (4% on an attention decode row, session 27). Include
 * once a file, from AMX kernels only. */
#ifndef KWK_AMX_TILES16_H
#define KWK_AMX_TILES16_H

#include "kernels/amx.h"

#define TC0 0
#define TC1 1
#define TC2 2
#define TC3 3
#define TA0 4
#define TA1 5
#define TB0 6
#define TB1 7

/* The configuration, a constant (amx.h says why). */
static const _Alignas(64) struct kwk_amx_config TILES16_CONFIG = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

#endif
