/* dispatch.c - picks the kernel table for an instruction set. Any thread: the tables are const
 * and kwk_isa() detects once. */
#include "base/base.h"
#include "kernels/kernels.h"

const struct kwk_kernels *kwk_kernels_for(int isa)
{
    /* Every table is compiled in (each file with its own flags); the CPU check lives in kwk_isa,
     * so asking for more than the CPU has is the caller's mistake and is clamped here. */
    int best = kwk_isa();
    if (isa > best)
        isa = best;
    switch (isa) {
    case KWK_ISA_AVX512:
        return &kwk_kernels_avx512;
    case KWK_ISA_AVX2:
        return &kwk_kernels_avx2;
    default:
        return &kwk_kernels_ref;
    }
}

const struct kwk_kernels *kwk_kernels(void)
{
    return kwk_kernels_for(kwk_isa());
}
