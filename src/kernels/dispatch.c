/* dispatch.c - picks the kernel table for an instruction set, and says where a matrix's rows
 * lie. Any thread: the tables are const and kwk_isa() detects once. */
#include "base/base.h"
#include "kernels/bf16t.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

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

int kwk_mat_rows_span(const struct kwk_mat *w, int64_t r0, int64_t r1, const void **p,
                      size_t *n)
{
    *p = NULL;
    *n = 0;
    if (r0 < 0 || r1 < r0 || r1 > w->rows || w->cols < 0)
        return -1;
    /* bytes of one row (plain types) or of one block of 16 rows (blocked) */
    size_t unit;
    int64_t first = r0, count = r1 - r0;
    switch (w->wtype) {
    case KWK_W_F32:
        unit = 4;
        break;
    case KWK_W_F16:
    case KWK_W_BF16:
        unit = 2;
        break;
    case KWK_W_BF16P: /* [rows/16][cols][16]: 16 rows hold as many bytes as 16 plain rows */
        if (r0 % 16 != 0 || (r1 % 16 != 0 && r1 != w->rows))
            return -1;
        unit = 2;
        count = (r1 - r0 + 15) / 16 * 16;
        break;
    case KWK_W_BF16T: /* [rows/16][cols/32] tiles of 1 KiB */
        if (r0 % 16 != 0 || (r1 % 16 != 0 && r1 != w->rows) ||
            kwk_bf16t_bytes(16, w->cols, &unit))
            return -1;
        first = r0 / 16;
        count = (r1 - r0 + 15) / 16;
        *p = (const char *)w->data + (size_t)first * unit;
        *n = (size_t)count * unit;
        return 0;
    default:
        if (!kwk_quant_group(w->wtype) || r0 % KWK_QROWS != 0 ||
            (r1 % KWK_QROWS != 0 && r1 != w->rows) ||
            kwk_quant_bytes(w->wtype, KWK_QROWS, w->cols, &unit))
            return -1;
        first = r0 / KWK_QROWS;
        count = (r1 - r0 + KWK_QROWS - 1) / KWK_QROWS;
        *p = (const char *)w->data + (size_t)first * unit;
        *n = (size_t)count * unit;
        return 0;
    }
    size_t row = unit * (size_t)w->cols;
    *p = (const char *)w->data + (size_t)first * row;
    *n = (size_t)count * row;
    return 0;
}

int kwk_mat_amx(const struct kwk_kernels *k, const struct kwk_mat *w)
{
    if (k != &kwk_kernels_avx512)
        return 0;
    if (w->wtype == KWK_W_BF16)
        return kwk_cpu_amx_preserve();
    if (w->wtype == KWK_W_BF16T) /* its prompts take tiles wherever AMX-BF16 is in use */
        return kwk_cpu_amx_bf16();
    return kwk_quant_group(w->wtype) && kwk_cpu_amx();
}

int kwk_mat_prefetch_l2(const struct kwk_mat *w)
{
    return w->prefetch ? w->prefetch == 2 : kwk_cpu_prefetch_l2();
}

int kwk_mat_decode_spans(const struct kwk_kernels *k, const struct kwk_mat *w, int64_t r0,
                         int64_t r1, size_t budget, const void **p, size_t *n, int max)
{
    const void *all;
    size_t bytes;
    if (max < 1 || r1 <= r0 || kwk_mat_rows_span(w, r0, r1, &all, &bytes))
        return 0;
    /* runs are cut in rows, or in panels or tile blocks of 16 rows */
    int blocked = w->wtype == KWK_W_BF16P || w->wtype == KWK_W_BF16T;
    int64_t unit = blocked ? 16 : 1, units = (r1 - r0 + unit - 1) / unit;
    /* quantized matrices, and bf16 ones on AMX (amx_bf16.c: groups of row blocks from r0), are
     * read in order */
    int in_order = kwk_quant_group(w->wtype) ||
                   ((w->wtype == KWK_W_BF16 || w->wtype == KWK_W_BF16T) && kwk_mat_amx(k, w));
    int runs = in_order                   ? 1
               : w->wtype == KWK_W_BF16T ? KWK_BF16T_DEC_RUNS
                                         : KWK_MAX(1, k->dec_runs);
    int64_t run = units / runs;
    if (run == 0) /* fewer units than runs: the kernels read them one after the other */
        runs = 1;
    size_t run_bytes = runs == 1 ? bytes : bytes / (size_t)units * (size_t)run;
    runs = KWK_MIN(runs, max);
    for (int i = 0; i < runs; i++) {
        p[i] = (const char *)all + (size_t)i * run_bytes;
        n[i] = KWK_MIN(run_bytes, budget / (size_t)runs);
    }
    return runs;
}

int kwk_preserve_wtype(const struct kwk_kernels *k)
{
    if (k->bf16_panels)
        return KWK_W_BF16P;
    if (k == &kwk_kernels_avx512 && kwk_cpu_amx_preserve_pack())
        return KWK_W_BF16T;
    return KWK_W_BF16;
}
