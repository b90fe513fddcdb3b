/* attn_ref.c - attention in plain C, item by item: the specification the SIMD tables are tested
 * against, and the table chooser. Pure functions; any thread. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/base.h"
#include "kernels/attn.h"

size_t kwk_attn_scratch_floats(const struct kwk_attn_args *a, int max_pos)
{
    size_t group = a->n_kv_heads > 0 ? (size_t)(a->n_heads / a->n_kv_heads) : 1;
    size_t padded = ((size_t)(max_pos > 0 ? max_pos : 0) + 15) / 16 * 16;
    size_t queries = KWK_MAX(group, (size_t)KWK_ATTN_TILE_QUERIES);
    size_t hd = (size_t)(a->head_dim > 0 ? a->head_dim : 0);
    /* + the bf16 table's interleaved values of one key range (kwk_attn_avx512_bf16), + the AMX
     * table's second form of 16 queries' weights and its values of a span (kwk_attn_amx_bf16) */
    return (queries + KWK_ATTN_TILE_QUERIES) * KWK_MAX(padded, (size_t)16) +
           (KWK_ATTN_TILE_QUERIES + 16) * hd + KWK_MAX((size_t)4096, 8 * hd) +
           KWK_ATTN_TILE_QUERIES * hd;
}

/* Work of one item of row r: its positions plus a fixed cost (the softmax, the output). */
static double row_cost(const struct kwk_attn_args *a, int r)
{
    long n = (long)a->last[r] - a->first[r] + 1;
    return (double)(n > 0 ? n : 0) + 16.0;
}

/* The first item of share t: the first unit (a kv group, or a head when there are too few groups
 * to go round evenly, as in a decode step, unless the table wants whole groups) before which
 * t/nth of the total work lies. */
static long split_at(const struct kwk_attn_args *a, int n_rows, double total, int t, int nth)
{
    long n_items = (long)n_rows * a->n_heads;
    if (t <= 0)
        return 0;
    if (t >= nth)
        return n_items;
    int unit = a->n_heads / a->n_kv_heads;
    if ((long)n_rows * a->n_kv_heads < 4L * nth && !a->whole_groups)
        unit = 1;
    int per_row = a->n_heads / unit;
    double target = total * (double)t / (double)nth, done = 0.0;
    for (int r = 0; r < n_rows; r++) {
        double c = row_cost(a, r) * unit;
        for (int u = 0; u < per_row; u++) {
            if (done >= target)
                return (long)r * a->n_heads + (long)u * unit;
            done += c;
        }
    }
    return n_items;
}

int kwk_attn_whole_groups(const struct kwk_attn_kernel *k, int head_dim)
{
    return k->whole_groups > 0 && head_dim > 0 && head_dim % k->whole_groups == 0;
}

int kwk_attn_whole_groups_for(const struct kwk_attn_kernel *k, int head_dim, double token_bytes)
{
    if (kwk_attn_whole_groups(k, head_dim))
        return 1;
    int n = k->whole_groups_past_llc;
    return n > 0 && head_dim > 0 && head_dim % n == 0 && kwk_cpu_past_llc(token_bytes);
}

int kwk_attn_span(const struct kwk_attn_kernel *k, int head_dim)
{
    return k->span > 0 && k->span_part && k->span_merge && kwk_attn_whole_groups(k, head_dim)
               ? k->span
               : 0;
}

size_t kwk_attn_parts_floats(const struct kwk_attn_args *a, int span, int max_pos)
{
    if (span <= 0 || max_pos <= 0)
        return 0;
    size_t spans = ((size_t)max_pos + (size_t)span - 1) / (size_t)span;
    return spans * (size_t)a->n_heads * (size_t)(a->head_dim + 2);
}

void kwk_attn_span_split(const struct kwk_attn_args *a, int row, int span, int ith, int nth,
                         long *u0, long *u1)
{
    long n = (long)a->last[row] - a->first[row] + 1;
    long ns = n > 0 && span > 0 ? (n + span - 1) / span : 0, units = ns * a->n_kv_heads;
    *u0 = *u1 = 0;
    if (nth < 1 || ith < 0 || ith >= nth || units == 0)
        return;
    /* a unit's work: its positions plus a fixed cost (its softmax, its parts, the tile's set-up);
     * each boundary at the unit edge nearest its target (rounding up gave the first thread of two
     * SmolLM2-135M's first 1.9 kv groups at 1088 positions instead of 1.5: spans of 512 are
     * coarse there) */
    double total = (double)n * a->n_kv_heads + 64.0 * (double)units;
    long at[2] = {units, units};
    for (int e = 0; e < 2; e++) {
        double target = total * (double)(ith + e) / (double)nth, done = 0.0;
        for (long u = 0; u < units; u++) {
            long s = u % ns;
            double next = done + (double)KWK_MIN((long)span, n - s * span) + 64.0;
            if (next > target) {
                at[e] = target - done <= next - target ? u : u + 1;
                break;
            }
            done = next;
        }
    }
    *u0 = ith == 0 ? 0 : at[0];
    *u1 = ith + 1 >= nth ? units : at[1];
}

void kwk_attn_split(const struct kwk_attn_args *a, int n_rows, int ith, int nth, long *i0,
                    long *i1)
{
    double total = 0.0;
    for (int r = 0; r < n_rows; r++)
        total += row_cost(a, r) * a->n_heads;
    if (nth < 1 || ith < 0 || ith >= nth) {
        *i0 = *i1 = 0;
        return;
    }
    *i0 = split_at(a, n_rows, total, ith, nth);
    *i1 = split_at(a, n_rows, total, ith + 1, nth);
}

/* Element i of a cache row: float, or half widened (exactly). */
static float kv_at(const struct kwk_attn_args *a, const void *base, size_t i)
{
    if (a->kv_half)
        return kwk_f16_to_f32(((const uint16_t *)base)[i]);
    return ((const float *)base)[i];
}

/* The same sums, in the same order, as the decoder's scalar path did with ref.c's dot, softmax
 * and axpy: a sequential dot per key, softmax with the max subtracted, then the weighted sum. */
static void item_ref(const struct kwk_attn_args *a, long item, float *p)
{
    int row = (int)(item / a->n_heads), h = (int)(item % a->n_heads), hd = a->head_dim;
    int kvh = h / (a->n_heads / a->n_kv_heads);
    int first = a->first[row], n = a->last[row] - first + 1;
    const float *q = a->q + row * a->ldq + (long)h * hd;
    size_t at = (size_t)first * (size_t)a->ld_pos + (size_t)kvh * (size_t)a->ld_head;
    float *out = a->out + row * a->ldo + (long)h * hd;
    memset(out, 0, sizeof(float) * (size_t)hd);
    if (n <= 0)
        return;
    for (int j = 0; j < n; j++) {
        size_t k = at + (size_t)j * (size_t)a->ld_pos;
        float s = 0.0f;
        for (int e = 0; e < hd; e++)
            s += q[e] * kv_at(a, a->k_rows[row], k + (size_t)e);
        p[j] = s * a->scale;
    }
    float mx = p[0];
    for (int j = 1; j < n; j++)
        mx = p[j] > mx ? p[j] : mx;
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        p[j] = expf(p[j] - mx);
        sum += p[j];
    }
    for (int j = 0; j < n; j++)
        p[j] /= sum;
    for (int j = 0; j < n; j++) {
        size_t v = at + (size_t)j * (size_t)a->ld_pos;
        for (int e = 0; e < hd; e++)
            out[e] += p[j] * kv_at(a, a->v_rows[row], v + (size_t)e);
    }
}

static void ref_items(const struct kwk_attn_args *a, long i0, long i1, float *scratch)
{
    for (long i = i0; i < i1; i++)
        item_ref(a, i, scratch);
}

const struct kwk_attn_kernel kwk_attn_ref = {.name = "scalar", .items = ref_items};

const struct kwk_attn_kernel *kwk_attn_kernel_for(int isa)
{
    /* As kwk_kernels_for: every table is compiled in, the CPU check lives in kwk_isa. */
    int best = kwk_isa();
    if (isa > best)
        isa = best;
    switch (isa) {
    case KWK_ISA_AVX512:
        return &kwk_attn_avx512;
    case KWK_ISA_AVX2:
        return &kwk_attn_avx2;
    default:
        return &kwk_attn_ref;
    }
}

const struct kwk_attn_kernel *kwk_attn_kernel(void)
{
    return kwk_attn_kernel_for(kwk_isa());
}

const struct kwk_attn_kernel *kwk_attn_kernel_act8(void)
{
    if (kwk_isa() == KWK_ISA_AVX512 && kwk_cpu_bf16())
        return kwk_cpu_amx_bf16() ? &kwk_attn_amx_bf16 : &kwk_attn_avx512_bf16;
    return kwk_attn_kernel();
}

/* ---- tiles of the SIMD tables -----------------------------------------------------------------
 */

/* Whether row s can join a tile that starts at row r: it reads the same keys and values, up to
 * a position no earlier (so that a tile's position counts grow with its rows). */
static int shares_keys(const struct kwk_attn_args *a, int r, int s)
{
    return a->k_rows[s] == a->k_rows[r] && a->v_rows[s] == a->v_rows[r] &&
           a->first[s] == a->first[r] && a->last[s] >= a->last[s - 1];
}

/* Query heads h .. h+nh-1 of nr rows from row through run, or zeros if the row attends nothing
 * (then nr is 1). */
static void tile_or_zeros(const struct kwk_attn_args *a, int row, int nr, int h, int nh,
                          kwk_attn_tile_fn run, float *scratch)
{
    if (a->last[row] < a->first[row])
        memset(a->out + row * a->ldo + (long)h * a->head_dim, 0,
               sizeof(float) * (size_t)nh * (size_t)a->head_dim);
    else
        run(a, row, nr, h, nh, scratch);
}

/* Items [i, i + n_heads * nr) are whole rows from row: tiles of up to KWK_ATTN_TILE_QUERIES. */
static void rows_tiles(const struct kwk_attn_args *a, int row, int nr, kwk_attn_tile_fn run,
                       float *scratch)
{
    int group = a->n_heads / a->n_kv_heads;
    int max_rows = KWK_MAX(1, KWK_ATTN_TILE_QUERIES / KWK_MIN(group, KWK_ATTN_TILE_HEADS));
    for (int r = row; r < row + nr;) {
        int len = 1;
        if (a->last[r] >= a->first[r])
            while (len < max_rows && r + len < row + nr && shares_keys(a, r, r + len))
                len++;
        for (int h = 0; h < a->n_heads;) {
            int nh = KWK_MIN((h / group + 1) * group - h, KWK_ATTN_TILE_HEADS);
            tile_or_zeros(a, r, len, h, nh, run, scratch);
            h += nh;
        }
        r += len;
    }
}

void kwk_attn_tiles(const struct kwk_attn_args *a, long i0, long i1, kwk_attn_tile_fn run,
                    float *scratch)
{
    int group = a->n_heads / a->n_kv_heads;
    for (long i = i0; i < i1;) {
        int row = (int)(i / a->n_heads), h = (int)(i % a->n_heads);
        long whole = h == 0 ? (i1 - i) / a->n_heads : 0; /* whole rows from here */
        if (whole > 0) {
            rows_tiles(a, row, (int)whole, run, scratch);
            i += whole * a->n_heads;
            continue;
        }
        /* A share's partial row: its kv groups one by one. */
        int end = (h / group + 1) * group;
        long nh = KWK_MIN((long)KWK_MIN(end - h, KWK_ATTN_TILE_HEADS), i1 - i);
        tile_or_zeros(a, row, 1, h, (int)nh, run, scratch);
        i += nh;
    }
}
