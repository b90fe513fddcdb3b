/* test_attn.c - the attention tables (kernels/attn.h): every table this CPU runs against a
 * double-precision statement of attention, on odd head sizes, GQA groups 1..7, 1..600 positions,
 * sliding windows and rows of several slots mixed in one call; and batch invariance: every item
 * computed alone equals, bitwise, the same item computed in ranges of any size and alignment. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "kernels/attn.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "test.h"


#define MAX_LEN 600
#define N_SLOTS 3

/* One layer's cache for N_SLOTS slots, a chunk of rows over it, and the arguments. Every buffer
 * is allocated at its exact size so that ASan sees any read past it. */
struct setup {
    struct kwk_attn_args a;
    int n_rows, max_pos;
    int kv_dim; /* n_kv_heads * head_dim: a slot's positions take MAX_LEN * kv_dim elements */
    float *q, *out, *kc, *vc;
    const void **k_rows, **v_rows;
    int *first, *last;
};

/* Rows: a prompt chunk at the end of slot 0, decode rows of every slot at random lengths (some
 * 1, some MAX_LEN), rows with a sliding window, and one row with no position at all. */
static void setup_rows(struct setup *s, int window)
{
    int n = s->n_rows, chunk = n / 2;
    for (int r = 0; r < n; r++) {
        int slot, last;
        if (r < chunk) {
            slot = 0;
            last = MAX_LEN - chunk + r;
        } else {
            slot = (int)(t_rnd() % N_SLOTS);
            int kind = (int)(t_rnd() % 4);
            last = kind == 0 ? 0 : kind == 1 ? MAX_LEN - 1 : (int)(t_rnd() % MAX_LEN);
        }
        int first = window > 0 && r % 2 ? KWK_MAX(0, last - window + 1) : 0;
        if (r == n - 1)
            first = last + 1; /* empty: zeros */
        s->k_rows[r] = s->kc + (size_t)slot * MAX_LEN * s->kv_dim;
        s->v_rows[r] = s->vc + (size_t)slot * MAX_LEN * s->kv_dim;
        s->first[r] = first;
        s->last[r] = last;
        s->max_pos = KWK_MAX(s->max_pos, last - first + 1);
    }
}

/* head_major: a slot's cache holds each kv head's positions in turn (the decoder's layout), else
 * each position's kv heads in turn. */
static void setup_new(struct setup *s, int hd, int n_heads, int n_kv, int n_rows, int window,
                      float q_range, int head_major)
{
    memset(s, 0, sizeof *s);
    int kv_dim = n_kv * hd;
    s->kv_dim = kv_dim;
    size_t cache = (size_t)N_SLOTS * MAX_LEN * (size_t)kv_dim;
    s->n_rows = n_rows;
    s->q = malloc(sizeof(float) * (size_t)n_rows * n_heads * hd);
    s->out = malloc(sizeof(float) * (size_t)n_rows * n_heads * hd);
    s->kc = malloc(sizeof(float) * cache);
    s->vc = malloc(sizeof(float) * cache);
    s->k_rows = malloc(sizeof(*s->k_rows) * (size_t)n_rows);
    s->v_rows = malloc(sizeof(*s->v_rows) * (size_t)n_rows);
    s->first = malloc(sizeof(int) * (size_t)n_rows);
    s->last = malloc(sizeof(int) * (size_t)n_rows);
    for (size_t i = 0; i < (size_t)n_rows * n_heads * hd; i++)
        s->q[i] = t_frand(-q_range, q_range);
    for (size_t i = 0; i < cache; i++) {
        s->kc[i] = t_frand(-1.0f, 1.0f);
        s->vc[i] = t_frand(-1.0f, 1.0f);
    }
    setup_rows(s, window);
    s->a = (struct kwk_attn_args){.head_dim = hd,
                                  .n_heads = n_heads,
                                  .n_kv_heads = n_kv,
                                  .ld_pos = head_major ? hd : kv_dim,
                                  .ld_head = head_major ? (long)MAX_LEN * hd : hd,
                                  .scale = 1.0f / sqrtf((float)hd),
                                  .q = s->q,
                                  .ldq = (long)n_heads * hd,
                                  .out = s->out,
                                  .ldo = (long)n_heads * hd,
                                  .k_rows = s->k_rows,
                                  .v_rows = s->v_rows,
                                  .first = s->first,
                                  .last = s->last};
}

static void setup_free(struct setup *s)
{
    free(s->q);
    free(s->out);
    free(s->kc);
    free(s->vc);
    free(s->k_rows);
    free(s->v_rows);
    free(s->first);
    free(s->last);
}

/* x rounded to the nearest bfloat16 (ties to even), as vcvtne2ps2bf16 does for the finite
 * normal numbers of these tests. */
static double bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    float r;
    memcpy(&r, &u, sizeof r);
    return r;
}

/* Whether a table computes with bf16 products (kwk_attn_avx512_bf16, kwk_attn_amx_bf16; head
 * sizes off 32 run their float tiles). */
static int rounds_bf16(const struct kwk_attn_kernel *k, const struct kwk_attn_args *a)
{
    return (k == &kwk_attn_avx512_bf16 || k == &kwk_attn_amx_bf16) && a->head_dim % 32 == 0;
}

/* Whether float x lies within 2^-16 of its size of a bfloat16 rounding tie (its low 16 bits
 * within 128 of 0x8000): a computation of x in float, off by that much, may round it to either
 * neighbour. */
static int near_bf16_tie(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    int low = (int)(u & 0xffffu) - 0x8000;
    return low >= -128 && low <= 128;
}

/* Attention of one item in double precision, independently of the library: out[hd]. With bf
 * the bf16 table's statement: queries, keys, values and the softmax's weights (exp(s - max))
 * rounded to bfloat16, the weights divided by the sum of their rounded values; and *slack, how
 * far an output may move because a weight near a rounding tie (which the table's float scores
 * and exp may round the other way) took its other neighbour: that weight's bfloat16 step, times
 * 2 (v - out, values in [-1, 1]) over the sum. */
static void item_double(const struct kwk_attn_args *a, long item, double *out, int bf, int span,
                        double *slack)
{
    int row = (int)(item / a->n_heads), h = (int)(item % a->n_heads), hd = a->head_dim;
    int kvh = h / (a->n_heads / a->n_kv_heads), first = a->first[row];
    int n = a->last[row] - first + 1;
    const float *q = a->q + row * a->ldq + (long)h * hd;
    double *w = malloc(sizeof(double) * (size_t)KWK_MAX(n, 1));
    double mx = -INFINITY, sum = 0.0;
    for (int j = 0; j < n; j++) {
        const float *k = (const float *)a->k_rows[row] + (first + j) * a->ld_pos + kvh * a->ld_head;
        double d = 0.0;
        for (int e = 0; e < hd; e++)
            d += bf ? bf16(q[e]) * bf16(k[e]) : (double)q[e] * k[e];
        w[j] = d * a->scale;
        mx = w[j] > mx ? w[j] : mx;
    }
    /* with spans (the AMX table): each span's weights are exp(s - the span's max), rounded,
     * then scaled by exp(the span's max - the row's) */
    double steps = 0.0;
    for (int j0 = 0; j0 < n; j0 += span > 0 ? span : n) {
        int j1 = span > 0 ? KWK_MIN(n, j0 + span) : n;
        double m = span > 0 ? -INFINITY : mx;
        for (int j = j0; j < j1 && span > 0; j++)
            m = w[j] > m ? w[j] : m;
        double scale = exp(m - mx);
        for (int j = j0; j < j1; j++) {
            w[j] = exp(w[j] - m);
            if (bf) {
                if (near_bf16_tie((float)w[j]))
                    steps += scale * ldexp(1.0, ilogb(w[j]) - 7); /* a bfloat16 step: 8 bits */
                w[j] = bf16((float)w[j]);
            }
            w[j] *= scale;
            sum += w[j];
        }
    }
    *slack = n > 0 ? 2.0 * steps / sum : 0.0;
    for (int e = 0; e < hd; e++)
        out[e] = 0.0;
    for (int j = 0; j < n; j++) {
        const float *v = (const float *)a->v_rows[row] + (first + j) * a->ld_pos + kvh * a->ld_head;
        for (int e = 0; e < hd; e++)
            out[e] += w[j] / sum * (bf ? bf16(v[e]) : v[e]);
    }
    free(w);
}

/* Every item of the table against the double statement: to float rounding of sums of up to 600
 * terms of magnitude <= 1. The bf16 tables against their own statement: within 2e-5 plus the
 * item's slack for the weights near a bfloat16 rounding tie, which the table's float exp may
 * round the other way (one weight's step moves an output by up to 2^-7 of the weight's share;
 * measured worst 1.4e-4), and none by more than 1e-3. Without the rounding the outputs would be
 * some 1e-3 off nearly everywhere. */
static void check_values(const struct kwk_attn_kernel *k, struct setup *s, float *scratch,
                         const char *what)
{
    const struct kwk_attn_args *a = &s->a;
    long n_items = (long)s->n_rows * a->n_heads;
    int bf = rounds_bf16(k, a), span = kwk_attn_span(k, a->head_dim);
    k->items(a, 0, n_items, scratch);
    double *want = malloc(sizeof(double) * (size_t)a->head_dim);
    double worst = 0.0, slack = 0.0;
    long off = 0, total = 0;
    for (long i = 0; i < n_items; i++) {
        item_double(a, i, want, bf, span, &slack);
        const float *got = a->out + (i / a->n_heads) * a->ldo + (i % a->n_heads) * a->head_dim;
        for (int e = 0; e < a->head_dim; e++) {
            double d = fabs(got[e] - want[e]);
            worst = d > worst || isnan(d) ? d : worst;
            off += !(d <= 2e-5 + slack);
            total++;
        }
    }
    if (bf)
        T_CHECK(worst <= 1e-3 && off == 0, "%s %s hd %d heads %d/%d: worst error %g, "
                "%ld of %ld over 2e-5 and the weights' rounding slack", k->name, what,
                a->head_dim, a->n_heads, a->n_kv_heads, worst, off, total);
    else
        T_CHECK(worst <= 5e-6, "%s %s hd %d heads %d/%d: worst error %g", k->name, what,
                a->head_dim, a->n_heads, a->n_kv_heads, worst);
    free(want);
}

/* Items computed alone, then in ranges [o, o+len), [o+len, o+2len) ... (with [0, o) first): the
 * outputs must be bitwise the same. */
static void check_invariance(const struct kwk_attn_kernel *k, struct setup *s, float *scratch)
{
    const struct kwk_attn_args *a = &s->a;
    long n_items = (long)s->n_rows * a->n_heads;
    size_t bytes = sizeof(float) * (size_t)n_items * a->head_dim;
    float *alone = malloc(bytes);
    for (long i = 0; i < n_items; i++)
        k->items(a, i, i + 1, scratch);
    memcpy(alone, a->out, bytes);
    long lens[] = {2, 3, 4, 5, 7, 8, 9, 13, 16, 31, n_items};
    int bad = 0, tried = 0;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (long o = 0; o < KWK_MIN(lens[li], 4); o++) {
            memset(a->out, 0xff, bytes);
            k->items(a, 0, KWK_MIN(o, n_items), scratch);
            for (long i = o; i < n_items; i += lens[li])
                k->items(a, i, KWK_MIN(i + lens[li], n_items), scratch);
            bad += memcmp(alone, a->out, bytes) != 0;
            tried++;
        }
    /* a random split into ranges, as a thread pool might make */
    memset(a->out, 0xff, bytes);
    for (long i = 0; i < n_items;) {
        long len = 1 + (long)(t_rnd() % 20);
        k->items(a, i, KWK_MIN(i + len, n_items), scratch);
        i += len;
    }
    bad += memcmp(alone, a->out, bytes) != 0;
    tried++;
    T_CHECK(bad == 0, "%s hd %d heads %d/%d: %d of %d range splits differ from items alone",
            k->name, a->head_dim, a->n_heads, a->n_kv_heads, bad, tried);
    free(alone);
}

/* Runs every item of a at once, then item by item: each run's output must be want, bitwise
 * (what: the case, for the failure's message). */
static void check_runs(const struct kwk_attn_kernel *k, struct kwk_attn_args *a, long n_items,
                       float *scratch, const float *want, const char *what)
{
    size_t bytes = sizeof(float) * (size_t)n_items * a->head_dim;
    memset(a->out, 0xff, bytes);
    k->items(a, 0, n_items, scratch);
    int whole = memcmp(want, a->out, bytes) == 0;
    memset(a->out, 0xff, bytes);
    for (long i = 0; i < n_items; i++)
        k->items(a, i, i + 1, scratch);
    int alone = memcmp(want, a->out, bytes) == 0;
    T_CHECK(whole && alone, "%s %s hd %d heads %d/%d (all items at once %d, alone %d)", k->name,
            what, a->head_dim, a->n_heads, a->n_kv_heads, whole, alone);
}

/* Another copy of the setup's caches in 16-bit elements, and the setup's rows pointed into it
 * (at kc's and vc's offsets): IEEE halves of the floats, or all NaN (to be filled). */
struct copy {
    uint16_t *k, *v;
    const void **kr, **vr;
};

static void copy_new(struct copy *c, const struct setup *s, int halves)
{
    size_t cache = (size_t)N_SLOTS * MAX_LEN * (size_t)s->kv_dim;
    c->k = malloc(sizeof(uint16_t) * cache);
    c->v = malloc(sizeof(uint16_t) * cache);
    c->kr = malloc(sizeof(void *) * (size_t)s->n_rows);
    c->vr = malloc(sizeof(void *) * (size_t)s->n_rows);
    for (size_t i = 0; i < cache; i++) {
        c->k[i] = halves ? kwk_f32_to_f16(s->kc[i]) : 0xffff;
        c->v[i] = halves ? kwk_f32_to_f16(s->vc[i]) : 0xffff;
    }
    for (int r = 0; r < s->n_rows; r++) {
        c->kr[r] = c->k + ((const float *)s->k_rows[r] - s->kc);
        c->vr[r] = c->v + ((const float *)s->v_rows[r] - s->vc);
    }
}

static void copy_free(struct copy *c)
{
    free(c->k);
    free(c->v);
    free(c->kr);
    free(c->vr);
}

/* A half cache: the float cache rounded to halves (kwk_f32_to_f16) and held both ways; the table
 * over the halves must give bitwise what it gives over the floats holding the same values (the
 * widening is exact, so nothing else may change), for the setup's rows as they are. */
static void check_half(const struct kwk_attn_kernel *k, struct setup *s, float *scratch)
{
    struct kwk_attn_args *a = &s->a;
    struct copy h;
    copy_new(&h, s, 1);
    size_t cache = (size_t)N_SLOTS * MAX_LEN * (size_t)s->kv_dim;
    for (size_t i = 0; i < cache; i++) {
        s->kc[i] = kwk_f16_to_f32(h.k[i]);
        s->vc[i] = kwk_f16_to_f32(h.v[i]);
    }
    long n_items = (long)s->n_rows * a->n_heads;
    size_t bytes = sizeof(float) * (size_t)n_items * a->head_dim;
    float *want = malloc(bytes);
    k->items(a, 0, n_items, scratch);
    memcpy(want, a->out, bytes);
    a->k_rows = h.kr;
    a->v_rows = h.vr;
    a->kv_half = 1;
    check_runs(k, a, n_items, scratch, want, "half cache: differs from floats of its values:");
    a->k_rows = s->k_rows;
    a->v_rows = s->v_rows;
    a->kv_half = 0;
    copy_free(&h);
    free(want);
}

/* A half cache staged for the bf16 table (kv_bf16): the table over the staged copy must give
 * bitwise what it gives over the halves, whole and item by item. The copy covers each row's
 * positions only (0 .. the setup's last + 1; the buffers around them hold NaNs, so a read past
 * them shows), and rows start on even positions (its contract). Head-major caches only
 * (ld_pos == head_dim), as the decoder's. Then the caches half_to_bf16 makes (the AMX table has
 * those and no staging). */
static void check_staged(const struct kwk_attn_kernel *k, struct setup *s, float *scratch)
{
    struct kwk_attn_args *a = &s->a;
    if ((!k->stage_bf16 && !k->half_to_bf16) || a->head_dim % 32 != 0 ||
        a->ld_pos != a->head_dim)
        return;
    struct copy h, st;
    copy_new(&h, s, 1);
    copy_new(&st, s, 0);
    int *fe = malloc(sizeof(int) * (size_t)s->n_rows), p1 = 0;
    for (int r = 0; r < s->n_rows; r++) {
        fe[r] = s->first[r] <= s->last[r] ? s->first[r] & ~1 : (s->last[r] + 2) & ~1;
        p1 = KWK_MAX(p1, s->last[r] + 1);
    }
    int hd = a->head_dim;
    for (int sl = 0; k->stage_bf16 && sl < N_SLOTS; sl++)
        for (int g = 0; g < a->n_kv_heads; g++) {
            size_t at = (size_t)sl * MAX_LEN * s->kv_dim + (size_t)g * MAX_LEN * hd;
            k->stage_bf16(1, h.k + at, h.v + at, st.k + at, st.v + at, 0, p1, hd);
        }
    long n_items = (long)s->n_rows * a->n_heads;
    size_t bytes = sizeof(float) * (size_t)n_items * hd;
    float *want = malloc(bytes);
    a->k_rows = h.kr; /* the halves first */
    a->v_rows = h.vr;
    a->first = fe;
    a->kv_half = 1;
    k->items(a, 0, n_items, scratch);
    memcpy(want, a->out, bytes);
    if (k->stage_bf16) {
        a->k_rows = st.kr; /* then the staged copy */
        a->v_rows = st.vr;
        a->kv_half = 0;
        a->kv_bf16 = 1;
        check_runs(k, a, n_items, scratch, want,
                   "staged bf16: differs from the halves it came from:");
    }
    /* Keys and values stored as half_to_bf16 makes them (the decoder's caches with bf16_kv):
     * read as they are, the same outputs (keys alone, then both); then with the values staged
     * from the bf16 values (half 2, kb NULL: a second staging copy whose keys must stay
     * untouched NaNs). */
    if (k->half_to_bf16) {
        struct copy kb, st2;
        copy_new(&kb, s, 1);
        copy_new(&st2, s, 0);
        size_t cache = (size_t)N_SLOTS * MAX_LEN * (size_t)s->kv_dim;
        k->half_to_bf16(kb.k, kb.k, (long)cache);
        k->half_to_bf16(kb.v, kb.v, (long)cache);
        /* positions past every row's last hold NaNs (0xffff), so a read past them shows */
        for (int sl = 0; sl < N_SLOTS; sl++)
            for (int g = 0; g < a->n_kv_heads; g++)
                for (long e = (long)p1 * hd; e < (long)MAX_LEN * hd; e++) {
                    size_t at = (size_t)sl * MAX_LEN * s->kv_dim + (size_t)g * MAX_LEN * hd;
                    kb.k[at + (size_t)e] = kb.v[at + (size_t)e] = 0xffff;
                }
        a->k_rows = kb.kr;
        a->v_rows = h.vr;
        a->kv_half = 1;
        a->kv_bf16 = 0;
        a->k_bf16 = 1;
        check_runs(k, a, n_items, scratch, want, "bf16 keys, half values: differ from halves:");
        a->v_rows = kb.vr;
        a->v_bf16 = 1;
        check_runs(k, a, n_items, scratch, want, "bf16 keys and values: differ from halves:");
        for (int sl = 0; k->stage_bf16 && sl < N_SLOTS; sl++)
            for (int g = 0; g < a->n_kv_heads; g++) {
                size_t at = (size_t)sl * MAX_LEN * s->kv_dim + (size_t)g * MAX_LEN * hd;
                k->stage_bf16(2, kb.k + at, kb.v + at, NULL, st2.v + at, 0, p1, hd);
            }
        if (k->stage_bf16) {
            size_t nan_keys = 0;
            for (size_t i = 0; i < cache; i++)
                nan_keys += st2.k[i] == 0xffff;
            T_EQ(nan_keys, cache);
            a->v_rows = st2.vr;
            a->kv_half = 0;
            a->kv_bf16 = 1;
            check_runs(k, a, n_items, scratch, want,
                       "bf16 keys, staged values: differ from halves:");
        }
        /* half_to_bf16 in place and out of place, any length: ld_bf's rounding */
        uint16_t out[37];
        k->half_to_bf16(out, h.k, 37);
        T_TRUE(memcmp(out, kb.k, sizeof out) == 0);
        a->v_bf16 = 0;
        a->k_bf16 = 0;
        copy_free(&kb);
        copy_free(&st2);
    }
    a->k_rows = s->k_rows;
    a->v_rows = s->v_rows;
    a->first = s->first;
    a->kv_half = 0;
    a->kv_bf16 = 0;
    copy_free(&h);
    copy_free(&st);
    free(fe);
    free(want);
}

struct shape {
    int hd, n_heads, n_kv;
};

static const struct shape shapes[] = {
    {64, 9, 3},  /* SmolLM2-135M */
    {64, 14, 2}, /* Qwen2.5-0.5B: groups of 7 */
    {80, 6, 2},  {128, 7, 7}, {32, 4, 4}, {96, 3, 1},
    {256, 4, 2}, /* Gemma 3 */
    {288, 2, 1}, /* an odd multiple of 32: a last pass of 32 value elements */
    {40, 6, 2},  /* off the AVX-512 width: its reference fallback */
    {20, 2, 1},  /* off both widths */
};

static void check_table(const struct kwk_attn_kernel *k)
{
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const struct shape *sh = &shapes[i];
        for (int variant = 0; variant < 4; variant++) {
            struct setup s;
            /* variants 1, 3: sharp softmax (large scores) and a sliding window of 37; 2, 3: the
             * cache position-major (kv heads of a position side by side) */
            int sharp = variant & 1;
            setup_new(&s, sh->hd, sh->n_heads, sh->n_kv, 12, sharp ? 37 : 0, sharp ? 6.0f : 1.0f,
                      variant < 2);
            size_t nf = kwk_attn_scratch_floats(&s.a, s.max_pos);
            float *scratch = malloc(sizeof(float) * nf);
            check_values(k, &s, scratch,
                         variant == 0   ? "flat"
                         : variant == 1 ? "sharp+window"
                         : variant == 2 ? "flat, position-major"
                                        : "sharp+window, position-major");
            check_invariance(k, &s, scratch);
            check_staged(k, &s, scratch);
            check_half(k, &s, scratch);
            free(scratch);
            setup_free(&s);
        }
    }
}

/* Every position count 1..80 at one row and head (each tail length of every block size). */
static void check_lengths(const struct kwk_attn_kernel *k)
{
    int bad = 0;
    for (int n = 1; n <= 80; n++) {
        struct setup s;
        setup_new(&s, 64, 3, 1, 1, 0, 2.0f, 1);
        s.first[0] = 3;
        s.last[0] = 3 + n - 1;
        s.max_pos = n;
        float *scratch = malloc(sizeof(float) * kwk_attn_scratch_floats(&s.a, n));
        int before = t_failed;
        check_values(k, &s, scratch, "length");
        check_staged(k, &s, scratch); /* a position count of each parity */
        bad += t_failed != before;
        free(scratch);
        setup_free(&s);
    }
    T_EQ(bad, 0);
}

/* A prompt chunk of 40 rows of one slot (rows attend 1..40 positions, or up to MAX_LEN), as
 * the decoder runs it: the tables share loads across neighbouring rows (several rows' heads at
 * once, queries in vector lanes, key ranges in passes), and each item must still equal, bitwise,
 * the item computed alone, and the double statement to rounding. */
static void check_chunk(const struct kwk_attn_kernel *k)
{
    static const struct shape chunk_shapes[] = {
        {64, 9, 3}, {64, 14, 2}, {128, 8, 2}, {128, 4, 4}, {64, 2, 1}, {80, 6, 2}, {16, 3, 1},
        {256, 4, 1}, {32, 8, 1},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof chunk_shapes / sizeof chunk_shapes[0]; i++)
        for (int at_end = 0; at_end < 2; at_end++) {
            const struct shape *sh = &chunk_shapes[i];
            struct setup s;
            setup_new(&s, sh->hd, sh->n_heads, sh->n_kv, 40, 0, 3.0f, 1);
            for (int r = 0; r < s.n_rows; r++) {
                s.k_rows[r] = s.kc;
                s.v_rows[r] = s.vc;
                s.first[r] = 0;
                s.last[r] = at_end ? MAX_LEN - s.n_rows + r : r;
            }
            s.max_pos = s.last[s.n_rows - 1] + 1;
            long n_items = (long)s.n_rows * s.a.n_heads;
            size_t bytes = sizeof(float) * (size_t)n_items * s.a.head_dim;
            float *scratch = malloc(sizeof(float) * kwk_attn_scratch_floats(&s.a, s.max_pos));
            float *alone = malloc(bytes);
            for (long it = 0; it < n_items; it++)
                k->items(&s.a, it, it + 1, scratch);
            memcpy(alone, s.out, bytes);
            int before = t_failed;
            check_values(k, &s, scratch, at_end ? "chunk at 600" : "chunk at 0");
            bad += t_failed != before;
            T_CHECK(memcmp(alone, s.out, bytes) == 0,
                    "%s chunk hd %d heads %d/%d: rows together "
                    "differ from items alone",
                    k->name, sh->hd, sh->n_heads, sh->n_kv);
            /* and split at every kv group, as a thread's share may start */
            memset(s.out, 0xff, bytes);
            int group = sh->n_heads / sh->n_kv;
            for (long it = 0; it < n_items; it += 7L * group)
                k->items(&s.a, it, KWK_MIN(it + 7L * group, n_items), scratch);
            T_CHECK(memcmp(alone, s.out, bytes) == 0,
                    "%s chunk hd %d heads %d/%d: shares of 7 "
                    "groups differ from items alone",
                    k->name, sh->hd, sh->n_heads, sh->n_kv);
            check_staged(k, &s, scratch);
            check_half(k, &s, scratch);
            free(alone);
            free(scratch);
            setup_free(&s);
        }
    T_EQ(bad, 0);
}

/* A one-row step shared out by spans (kwk_attn_kernel.span_part, span_merge), as a decode step
 * goes to threads by positions: each kv group's span computed alone, in reverse order, then the
 * row's heads merged in two ranges. The outputs must be bitwise the row's items', over float
 * caches and over half caches rounded to bf16 (the decoder's), for rows of 1 to MAX_LEN
 * positions from position 0 and from inside the cache (a sliding window's). */
static void check_spans(const struct kwk_attn_kernel *k)
{
    static const struct {
        int hd, n_heads, n_kv;
    } shapes[] = {{64, 9, 3}, {128, 7, 1}, {64, 15, 5}, {32, 4, 2}, {96, 6, 3}, {80, 4, 2}};
    static const int lens[] = {1, 17, 255, 256, 257, 300, 511, 512, 513, 563, 600};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int hd = shapes[si].hd, nh = shapes[si].n_heads, nkv = shapes[si].n_kv;
        int span = kwk_attn_span(k, hd);
        if (span == 0) { /* only the AMX table has spans, and only on its tiles' head sizes */
            T_CHECK(k != &kwk_attn_amx_bf16 || hd % 32 != 0, "%s hd %d: no spans", k->name, hd);
            continue;
        }
        struct setup s;
        setup_new(&s, hd, nh, nkv, 2, 0, 1.0f, 1);
        float *scratch = malloc(sizeof(float) * kwk_attn_scratch_floats(&s.a, MAX_LEN));
        float *parts = malloc(sizeof(float) * kwk_attn_parts_floats(&s.a, span, MAX_LEN));
        size_t bytes = sizeof(float) * (size_t)nh * hd;
        float *want = malloc(bytes);
        int bad = 0, tried = 0;
        for (int bf = 0; bf < 2; bf++) {
            struct copy c;
            if (bf) { /* the decoder's bf16 cache: halves rounded by the table's half_to_bf16 */
                copy_new(&c, &s, 1);
                size_t cache = (size_t)N_SLOTS * MAX_LEN * (size_t)s.kv_dim;
                k->half_to_bf16(c.k, c.k, (long)cache);
                k->half_to_bf16(c.v, c.v, (long)cache);
                s.a.k_rows = c.kr;
                s.a.v_rows = c.vr;
                s.a.kv_half = s.a.k_bf16 = s.a.v_bf16 = 1;
            }
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                for (int first = 0; first <= 37; first += 37) {
                    if (first + lens[li] > MAX_LEN)
                        continue;
                    s.first[0] = first;
                    s.last[0] = first + lens[li] - 1;
                    k->items(&s.a, 0, nh, scratch);
                    memcpy(want, s.out, bytes);
                    memset(s.out, 0xff, bytes);
                    int ns = (lens[li] + span - 1) / span;
                    for (int u = nkv * ns - 1; u >= 0; u--)
                        k->span_part(&s.a, 0, u / ns, u % ns, parts, scratch);
                    k->span_merge(&s.a, 0, 0, nh / 2, parts);
                    k->span_merge(&s.a, 0, nh / 2, nh, parts);
                    bad += memcmp(want, s.out, bytes) != 0;
                    tried++;
                }
            if (bf) {
                s.a.k_rows = s.k_rows;
                s.a.v_rows = s.v_rows;
                s.a.kv_half = s.a.k_bf16 = s.a.v_bf16 = 0;
                copy_free(&c);
            }
        }
        T_CHECK(bad == 0 && tried > 0, "%s hd %d heads %d/%d: %d of %d rows by spans differ "
                "from their items", k->name, hd, nh, nkv, bad, tried);
        free(want);
        free(parts);
        free(scratch);
        setup_free(&s);
    }
}

/* Work of a row's span units [0, u) when it attends n positions in spans of span: positions
 * plus 64 a unit (kwk_attn_span_split's measure). */
static double span_units_work(long u, int n, int span)
{
    int ns = (n + span - 1) / span;
    double w = 0.0;
    for (long i = 0; i < u; i++)
        w += KWK_MIN(span, n - (int)(i % ns) * span) + 64.0;
    return w;
}

/* kwk_attn_span_split: a row's (group, span) units go to the threads in order, whole, and each
 * boundary between two shares is the unit edge nearest its even share of the work (so each share
 * is within one unit's work of 1/nth of the row's). Before, a boundary rounded up: at 1088
 * positions in spans of 512, three groups on two threads went as 5 + 4 units, 2112 + 1152
 * positions. */
static void check_span_split(void)
{
    struct setup s;
    setup_new(&s, 64, 9, 3, 2, 0, 1.0f, 1);
    static const int lens[] = {1, 255, 256, 257, 600, 1088, 4100};
    static const int spans[] = {256, 512};
    for (size_t si = 0; si < sizeof spans / sizeof spans[0]; si++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
            for (int nth = 1; nth <= 12; nth++) {
                int n = lens[li], span = spans[si], ns = (n + span - 1) / span;
                long units = 3L * ns;
                s.first[0] = 0;
                s.last[0] = n - 1;
                long at = 0;
                int bad = 0;
                double total = span_units_work(units, n, span);
                for (int ith = 0; ith < nth; ith++) {
                    long u0, u1;
                    kwk_attn_span_split(&s.a, 0, span, ith, nth, &u0, &u1);
                    bad += u0 != at || u1 < u0;
                    if (ith > 0) { /* the edge nearest the target: neither neighbour is nearer */
                        double target = total * ith / nth;
                        double off = fabs(span_units_work(u0, n, span) - target);
                        if (u0 > 0)
                            bad += fabs(span_units_work(u0 - 1, n, span) - target) < off;
                        if (u0 < units)
                            bad += fabs(span_units_work(u0 + 1, n, span) - target) < off;
                    }
                    at = u1;
                }
                T_CHECK(bad == 0 && at == units,
                        "span split of %d positions (spans of %d) in %d: %d bad shares, ends at "
                        "%ld of %ld", n, span, nth, bad, at, units);
            }
    long u0, u1;
    s.first[0] = 0; /* the case that was off: 1088 positions, spans of 512, two threads */
    s.last[0] = 1087;
    kwk_attn_span_split(&s.a, 0, 512, 0, 2, &u0, &u1);
    T_CHECK(u0 == 0 && u1 == 4, "1088 positions on two threads: the first share is units %ld..%ld "
            "(want 0..4: group 0 and group 1's first span)", u0, u1);
    kwk_attn_span_split(&s.a, 0, 0, 0, 2, &u0, &u1); /* no span (a table without): no units */
    T_CHECK(u0 == 0 && u1 == 0, "span 0: units %ld..%ld", u0, u1);
    s.last[0] = s.first[0] - 1; /* nothing attended: no units */
    kwk_attn_span_split(&s.a, 0, 256, 0, 2, &u0, &u1);
    T_CHECK(u0 == 0 && u1 == 0, "empty row: units %ld..%ld", u0, u1);
    setup_free(&s);
}

/* kwk_attn_split: the shares tile [0, n_items) in order, start on kv group boundaries, and each
 * holds about 1/nth of the work (positions attended + 16 per item), within one group's work; a
 * single row (decode) is split by head, or by whole groups where the table asks for them
 * (whole_groups: the AMX table). */
static void check_split(void)
{
    struct setup s;
    setup_new(&s, 64, 9, 3, 40, 0, 1.0f, 1);
    for (int r = 0; r < s.n_rows; r++) { /* a prompt chunk: costs grow along the rows */
        s.first[r] = 0;
        s.last[r] = 100 + 10 * r;
    }
    s.last[7] = -1; /* an empty row */
    long n_items = (long)s.n_rows * 9;
    double total = 0.0, group_max = 0.0;
    for (int r = 0; r < s.n_rows; r++) {
        double c = (double)KWK_MAX(0, s.last[r] - s.first[r] + 1) + 16.0;
        total += 9 * c;
        group_max = KWK_MAX(group_max, 3 * c);
    }
    for (int nth = 1; nth <= 5; nth++) {
        long at = 0;
        int bad = 0;
        for (int ith = 0; ith < nth; ith++) {
            long i0, i1;
            kwk_attn_split(&s.a, s.n_rows, ith, nth, &i0, &i1);
            double w = 0.0;
            for (long i = i0; i < i1; i++)
                w += (double)KWK_MAX(0, s.last[i / 9] - s.first[i / 9] + 1) + 16.0;
            bad += i0 != at || i1 < i0 || i0 % 3 != 0 || fabs(w - total / nth) > group_max;
            at = i1;
        }
        T_CHECK(bad == 0 && at == n_items, "split in %d: %d bad shares, ends at %ld of %ld", nth,
                bad, at, n_items);
    }
    long i0, i1;
    kwk_attn_split(&s.a, s.n_rows, 2, 2, &i0, &i1);
    T_EQ(i1 - i0, 0);
    kwk_attn_split(&s.a, 1, 0, 2, &i0, &i1); /* one row of 9 heads on 2 threads: 5 + 4 */
    T_EQ(i0, 0);
    T_EQ(i1, 5);
    kwk_attn_split(&s.a, 1, 1, 2, &i0, &i1);
    T_EQ(i0, 5);
    T_EQ(i1, 9);
    /* whole groups: the same row as groups 0-1 and 2 (the first share takes the group that
     * crosses half the work); on 1-5 threads every share starts on a group and they tile the
     * row in order, so at most 3 threads get work */
    s.a.whole_groups = 1;
    kwk_attn_split(&s.a, 1, 0, 2, &i0, &i1);
    T_EQ(i0, 0);
    T_EQ(i1, 6);
    kwk_attn_split(&s.a, 1, 1, 2, &i0, &i1);
    T_EQ(i0, 6);
    T_EQ(i1, 9);
    for (int nth = 1; nth <= 5; nth++) {
        long at = 0;
        int bad = 0, busy = 0;
        for (int ith = 0; ith < nth; ith++) {
            kwk_attn_split(&s.a, 1, ith, nth, &i0, &i1);
            bad += i0 != at || i1 < i0 || i0 % 3 != 0 || i1 % 3 != 0;
            busy += i1 > i0;
            at = i1;
        }
        T_CHECK(bad == 0 && at == 9 && busy == KWK_MIN(nth, 3),
                "whole groups in %d: %d bad shares, ends at %ld, %d busy", nth, bad, at, busy);
    }
    /* a prompt chunk is shared by groups either way: the same shares as without the flag */
    for (int nth = 1; nth <= 5; nth++)
        for (int ith = 0; ith < nth; ith++) {
            long j0, j1;
            kwk_attn_split(&s.a, s.n_rows, ith, nth, &i0, &i1);
            s.a.whole_groups = 0;
            kwk_attn_split(&s.a, s.n_rows, ith, nth, &j0, &j1);
            s.a.whole_groups = 1;
            T_CHECK(i0 == j0 && i1 == j1, "chunk split %d/%d moved by whole_groups", ith, nth);
        }
    setup_free(&s);
    /* which tables ask for it: the AMX table on the head sizes its tiles take (multiples of 32),
     * not on the others (its float tiles) nor any vector table */
    int sizes[] = {32, 64, 80, 96, 128, 48, 16, 0};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int hd = sizes[i];
        T_EQ(kwk_attn_whole_groups(&kwk_attn_amx_bf16, hd), hd > 0 && hd % 32 == 0);
        T_EQ(kwk_attn_whole_groups(&kwk_attn_avx512_bf16, hd), 0);
        T_EQ(kwk_attn_whole_groups(&kwk_attn_avx512, hd), 0);
        T_EQ(kwk_attn_whole_groups(&kwk_attn_avx2, hd), 0);
        T_EQ(kwk_attn_whole_groups(&kwk_attn_ref, hd), 0);
    }
    /* and for a model's bytes a token: the same where they fit the last-level cache (or are not
     * known); past it, the bf16 vector table too, on the head sizes its tiles take */
    double llc = kwk_cpu_llc_bytes(); /* test_llc checks it */
    double fits = llc > 0 ? 0.5 * llc : 1024.0, past = llc > 0 ? 2.0 * llc : 1e15;
    const struct kwk_attn_kernel *tables[] = {&kwk_attn_amx_bf16, &kwk_attn_avx512_bf16,
                                              &kwk_attn_avx512, &kwk_attn_avx2, &kwk_attn_ref};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++) {
            int hd = sizes[i], own = kwk_attn_whole_groups(tables[t], hd);
            int bf16_past = tables[t] == &kwk_attn_avx512_bf16 && llc > 0 && hd > 0 && hd % 32 == 0;
            T_EQ(kwk_attn_whole_groups_for(tables[t], hd, 0.0), own);
            T_EQ(kwk_attn_whole_groups_for(tables[t], hd, fits), own);
            T_EQ(kwk_attn_whole_groups_for(tables[t], hd, past), own || bf16_past);
        }
}

/* The table follows kwk_isa() and so KWKER_ISA; each value is tried in a child process since
 * kwk_isa() detects once. The child exits 0 when the table matches the chosen ISA. */
static int table_matches_env(const char *value)
{
    pid_t pid = fork();
    if (pid == 0) {
        setenv("KWKER_ISA", value, 1);
        int isa = kwk_isa();
        int ok = kwk_attn_kernel() == kwk_attn_kernel_for(isa) &&
                 !strcmp(kwk_attn_kernel()->name, kwk_isa_name(isa)) &&
                 !strcmp(kwk_attn_kernel()->name, kwk_kernels()->name) &&
                 (strcmp(value, "scalar") || kwk_attn_kernel() == &kwk_attn_ref) &&
                 /* bf16 products only on the AVX-512 path */
                 (isa == KWK_ISA_AVX512 || kwk_attn_kernel_act8() == kwk_attn_kernel());
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int main(void)
{
    T_EQ(table_matches_env("scalar"), 0);
    T_EQ(table_matches_env("avx2"), 0);
    T_EQ(table_matches_env("avx512"), 0);
    check_split();
    check_span_split();
    int isa = kwk_isa();
    T_STREQ(kwk_attn_kernel()->name, kwk_isa_name(isa));
    const struct kwk_attn_kernel *tables[] = {&kwk_attn_ref, &kwk_attn_avx2, &kwk_attn_avx512,
                                              &kwk_attn_avx512_bf16, &kwk_attn_amx_bf16};
    int n_tables = isa >= KWK_ISA_AVX512 ? 3 + kwk_cpu_bf16() + kwk_cpu_amx_bf16()
                   : isa >= KWK_ISA_AVX2 ? 2
                                         : 1;
    /* the act8 table: bf16 products exactly where the CPU has them and avx512 is chosen, on
     * AMX where it has AMX-BF16 (and KWKER_AMX is not off) */
    T_CHECK(kwk_attn_kernel_act8() == (n_tables == 5   ? &kwk_attn_amx_bf16
                                       : n_tables == 4 ? &kwk_attn_avx512_bf16
                                                       : kwk_attn_kernel()),
            "act8 table %s", kwk_attn_kernel_act8()->name);
    printf("test_attn: isa %s, %d table(s) checked%s\n", kwk_isa_name(isa), n_tables,
           n_tables == 5   ? " (with bf16 products, on AVX-512 and on AMX)"
           : n_tables == 4 ? " (with bf16 products; no AMX-BF16 here (or KWKER_AMX=off): its "
                             "table not run)"
           : isa >= KWK_ISA_AVX512 ? " (no AVX512_BF16 here: its bf16 tables not run)"
                                   : "");
    for (int i = 0; i < n_tables; i++) {
        check_lengths(tables[i]);
        check_table(tables[i]);
        check_chunk(tables[i]);
        check_spans(tables[i]);
    }
    return t_report("test_attn");
}
