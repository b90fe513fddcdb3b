/* amx.h - what the AMX kernels (amx*.c) share: the tile configuration's layout. Each kernel
 * keeps its configuration as a constant in read-only memory rather than a struct filled on the
 * stack: LDTILECFG is a builtin whose memory operand a compiler may not see, and an invalid
 * configuration faults (llama.cpp's AMX path crashed so on an Intel Xeon 6 host, session 26).
 * Each kernel loads its own configuration on entry, so they may follow one another on a
 * thread. */
#ifndef KWK_AMX_H
#define KWK_AMX_H

#include <stdint.h>

/* LDTILECFG's 64-byte operand (palette 1): tile i has rows[i] rows of colsb[i] bytes. */
struct kwk_amx_config {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

#endif
