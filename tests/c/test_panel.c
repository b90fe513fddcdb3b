/* test_panel.c - bf16 panels (kernels/panel.h): packing and reading back, the scalar matmul
 * against double precision, and every table this CPU runs bitwise equal to it on odd sizes, row
 * ranges cutting panels, token counts across tiles and blocks, and one token against a batch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "kernels/kernels.h"
#include "kernels/panel.h"
#include "test.h"


#define SENTINEL 12345.0f

/* A rows x cols matrix: its bf16 values row-major as floats, and packed into panels. */
struct pmat {
    float *rows_f; /* [rows][cols] */
    struct kwk_mat w;
};

static struct pmat make_pmat(int64_t rows, int64_t cols)
{
    struct pmat m = {.rows_f = malloc((size_t)(rows * cols + 1) * sizeof(float))};
    for (int64_t i = 0; i < rows * cols; i++) {
        uint32_t s = t_rnd() & 1, e = 121 + t_rnd() % 10, u = s << 31 | e << 23 | (t_rnd() & 0x7f) << 16;
        memcpy(&m.rows_f[i], &u, sizeof u);
    }
    size_t bytes = 0;
    T_EQ(kwk_panel_bytes(rows, cols, &bytes), 0);
    void *data = kwk_malloc_aligned(bytes ? bytes : 64);
    memset(data, 0xa5, bytes); /* packing must write every byte, padding rows included */
    for (int64_t p = 0; p * KWK_PANEL_ROWS < rows; p++)
        kwk_panel_pack_rows(data, rows, cols, p, m.rows_f + p * KWK_PANEL_ROWS * cols, (long)cols);
    m.w = (struct kwk_mat){.wtype = KWK_W_BF16P, .rows = rows, .cols = cols, .data = data};
    return m;
}

static void free_pmat(struct pmat *m)
{
    free(m->rows_f);
    kwk_free_aligned((void *)m->w.data);
}

static void test_pack(void)
{
    size_t bytes = 0;
    T_EQ(kwk_panel_bytes(17, 3, &bytes), 0);
    T_EQ(bytes, 2 * 3 * 16 * 2); /* two panels, the second padded */
    T_EQ(kwk_panel_bytes(-1, 3, &bytes), -1);
    T_EQ(kwk_panel_bytes(INT64_MAX / 2, INT64_MAX / 2, &bytes), -1);
    T_EQ(bytes, 0);
    struct pmat m = make_pmat(21, 37);
    const uint16_t *h = m.w.data;
    long bad = 0;
    float row[37];
    for (int64_t r = 0; r < 21; r++) {
        kwk_panel_mat_row(&m.w, r, row);
        bad += memcmp(row, m.rows_f + r * 37, sizeof row) != 0;
    }
    /* panel 1 holds rows 16-20; its 11 padding rows are zeros */
    for (int64_t k = 0; k < 37; k++)
        for (int i = 5; i < 16; i++)
            bad += h[(37 + k) * 16 + (i < 8 ? 2 * i : 2 * (i - 8) + 1)] != 0;
    /* word i of a column: row i low, row 8 + i high (the order the AVX2 loads rely on) */
    uint32_t u0, u8;
    memcpy(&u0, &m.rows_f[0 * 37 + 5], 4);
    memcpy(&u8, &m.rows_f[8 * 37 + 5], 4);
    bad += h[5 * 16 + 0] != u0 >> 16 || h[5 * 16 + 1] != u8 >> 16;
    T_CHECK(bad == 0, "panel pack / mat_row: %ld differ", bad);
    for (int isa = KWK_ISA_SCALAR; isa <= kwk_isa(); isa++) {
        kwk_kernels_for(isa)->mat_row(&m.w, 19, row);
        T_CHECK(!memcmp(row, m.rows_f + 19 * 37, sizeof row), "%s mat_row of a panel",
                kwk_kernels_for(isa)->name);
    }
    free_pmat(&m);
}

/* Table k on rows [r0, r1) against the scalar specification (bitwise), which is checked against
 * double precision; rows outside the range and the gap up to ldy stay untouched. */
static void check_matmul(const struct kwk_kernels *k, int64_t rows, int64_t cols, int n_tok,
                         int64_t r0, int64_t r1)
{
    struct pmat m = make_pmat(rows, cols);
    float *x = malloc((size_t)(n_tok * cols + 1) * sizeof *x);
    for (int64_t i = 0; i < n_tok * cols; i++)
        x[i] = t_frand(-1.0f, 1.0f);
    long ldy = (long)rows + 3;
    size_t ny = (size_t)n_tok * (size_t)ldy;
    float *y = malloc(ny * sizeof *y), *yr = malloc(ny * sizeof *yr);
    for (size_t i = 0; i < ny; i++)
        y[i] = yr[i] = SENTINEL;
    k->matmul(&m.w, x, n_tok, y, ldy, r0, r1);
    kwk_panel_matmul_ref(&m.w, x, n_tok, yr, ldy, r0, r1);
    long differ = 0, far = 0, touched = 0;
    for (int t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < ldy; r++) {
            size_t i = (size_t)t * (size_t)ldy + (size_t)r;
            if (r < r0 || r >= r1) {
                touched += y[i] != SENTINEL || yr[i] != SENTINEL;
                continue;
            }
            differ += memcmp(&y[i], &yr[i], sizeof y[i]) != 0;
            double exact = 0.0, mag = 0.0;
            for (int64_t c = 0; c < cols; c++) {
                double p = (double)m.rows_f[r * cols + c] * (double)x[t * cols + c];
                exact += p;
                mag += fabs(p);
            }
            far += !(fabs(yr[i] - exact) <= 1e-5 * mag + 1e-30);
        }
    T_CHECK(differ == 0 && far == 0 && touched == 0,
            "%s panel matmul rows=%lld cols=%lld n_tok=%d [%lld,%lld): %ld differ from the "
            "scalar table, %ld far from double, %ld touched outside", k->name, (long long)rows,
            (long long)cols, n_tok, (long long)r0, (long long)r1, differ, far, touched);
    free_pmat(&m);
    free(x);
    free(y);
    free(yr);
}

/* Token t alone, over two row ranges that cut a panel, equals its row of the batch. */
static void check_invariance(const struct kwk_kernels *k, int64_t rows, int64_t cols, int n_tok)
{
    struct pmat m = make_pmat(rows, cols);
    float *x = malloc((size_t)(n_tok * cols) * sizeof *x);
    for (int64_t i = 0; i < n_tok * cols; i++)
        x[i] = t_frand(-1.0f, 1.0f);
    float *yb = malloc((size_t)(n_tok * rows) * sizeof *yb), *y1 = malloc((size_t)rows * sizeof *y1);
    k->matmul(&m.w, x, n_tok, yb, (long)rows, 0, rows);
    long diff = 0;
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + (size_t)t * (size_t)cols;
        k->matmul(&m.w, xt, 1, y1, (long)rows, 0, rows / 2 + 3);
        k->matmul(&m.w, xt, 1, y1, (long)rows, rows / 2 + 3, rows);
        diff += memcmp(y1, yb + (size_t)t * (size_t)rows, (size_t)rows * sizeof *y1) != 0;
    }
    T_CHECK(diff == 0, "%s panel rows=%lld cols=%lld n_tok=%d: %ld tokens differ from alone",
            k->name, (long long)rows, (long long)cols, n_tok, diff);
    free_pmat(&m);
    free(x);
    free(yb);
    free(y1);
}

static void test_table(const struct kwk_kernels *k)
{
    static const int64_t cols_list[] = {1, 7, 255, 256, 257, 600};
    static const int64_t rows_list[] = {1, 5, 16, 17, 40};
    static const int toks_list[] = {1, 2, 6, 7, 25, 31};
    for (size_t a = 0; a < KWK_ARRAY_LEN(cols_list); a++)
        for (size_t b = 0; b < KWK_ARRAY_LEN(rows_list); b++)
            for (size_t c = 0; c < KWK_ARRAY_LEN(toks_list); c++) {
                int64_t rows = rows_list[b], cols = cols_list[a];
                int n = toks_list[c];
                check_matmul(k, rows, cols, n, 0, rows);
                if (rows > 2)
                    check_matmul(k, rows, cols, n, 1, rows - 1);
                if (rows > 16)
                    check_matmul(k, rows, cols, n, 16, rows);
                if (rows == 40)
                    check_matmul(k, rows, cols, n, 3, 35);
            }
    /* decode's runs of panels: 9 whole panels (runs of 2 and a rest) and a cut one, 3 passes */
    check_matmul(k, 149, 520, 1, 0, 149);
    check_matmul(k, 149, 520, 1, 7, 140);
    check_matmul(k, 0, 9, 3, 0, 0);
    check_invariance(k, 149, 520, 5);
    check_invariance(k, 37, 577, 30);
    check_invariance(k, 64, 256, 49);
}

int main(void)
{
    test_pack();
    int isa = kwk_isa();
    for (int i = KWK_ISA_SCALAR; i <= isa; i++)
        test_table(kwk_kernels_for(i));
    T_TRUE(kwk_kernels_for(KWK_ISA_SCALAR)->bf16_panels == 0); /* scalar keeps row-major */
    return t_report("test_panel");
}
