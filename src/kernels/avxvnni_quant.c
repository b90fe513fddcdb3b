/* avxvnni_quant.c - the AVX2 quantized matmul with AVX-VNNI's vpdpbusd (avx2_tiles.h): one
 * instruction a 32-byte weight vector and token where AVX2 needs four (sign, maddubs, madd,
 * add), bit for bit the same sums. Built with -mavxvnni; reached only through
 * kwk_quant_matmul_avx2 / kwk_quant_matmul_q_avx2 when kwk_cpu_avxvnni() says the CPU has it. */
#define AVX2_TILES_VNNI 1
#include "kernels/avx2_tiles.h"
