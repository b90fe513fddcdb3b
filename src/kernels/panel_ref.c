/* panel_ref.c - bf16 panels (panel.h) in plain C: their size, packing, a row read back, and the
 * matmul in the order every table follows. Pure functions; any thread. */
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "kernels/panel.h"

int kwk_panel_bytes(int64_t rows, int64_t cols, size_t *out)
{
    *out = 0;
    if (rows < 0 || cols < 0)
        return -1;
    size_t panels = (size_t)((rows + KWK_PANEL_ROWS - 1) / KWK_PANEL_ROWS), n;
    if (kwk_mul_size(panels, (size_t)cols, &n) ||
        kwk_mul_size(n, KWK_PANEL_ROWS * sizeof(uint16_t), out))
        return -1;
    return 0;
}

/* Where row i (0..15) of a panel sits among a column's 16 halves. */
static int slot_of(int i)
{
    return i < 8 ? 2 * i : 2 * (i - 8) + 1;
}

static const uint16_t *panel_at(const struct kwk_mat *w, int64_t p)
{
    return (const uint16_t *)w->data + (size_t)p * (size_t)w->cols * KWK_PANEL_ROWS;
}

void kwk_panel_pack_rows(void *data, int64_t rows, int64_t cols, int64_t p, const float *src,
                         long ld)
{
    uint16_t *dst = (uint16_t *)data + (size_t)p * (size_t)cols * KWK_PANEL_ROWS;
    int n = (int)KWK_MIN((int64_t)KWK_PANEL_ROWS, rows - p * KWK_PANEL_ROWS);
    memset(dst, 0, (size_t)cols * KWK_PANEL_ROWS * sizeof *dst);
    for (int i = 0; i < n; i++)
        for (int64_t k = 0; k < cols; k++) {
            uint32_t u;
            memcpy(&u, src + (size_t)i * (size_t)ld + k, sizeof u);
            dst[(size_t)k * KWK_PANEL_ROWS + slot_of(i)] = (uint16_t)(u >> 16);
        }
}

void kwk_panel_mat_row(const struct kwk_mat *w, int64_t r, float *out)
{
    const uint16_t *h = panel_at(w, r / KWK_PANEL_ROWS) + slot_of((int)(r % KWK_PANEL_ROWS));
    for (int64_t k = 0; k < w->cols; k++)
        out[k] = kwk_bf16_to_f32(h[(size_t)k * KWK_PANEL_ROWS]);
}

void kwk_panel_matmul_ref(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                          int64_t r0, int64_t r1)
{
    int64_t cols = w->cols;
    for (int t = 0; t < n_tok; t++)
        for (int64_t r = r0; r < r1; r++) {
            const uint16_t *h =
                panel_at(w, r / KWK_PANEL_ROWS) + slot_of((int)(r % KWK_PANEL_ROWS));
            const float *xt = x + (size_t)t * (size_t)cols;
            float *yr = y + (int64_t)t * ldy + r;
            if (cols == 0)
                *yr = 0.0f;
            for (int64_t k0 = 0; k0 < cols; k0 += KWK_PANEL_KC) {
                int64_t k1 = KWK_MIN(cols, k0 + KWK_PANEL_KC);
                float s = 0.0f;
                for (int64_t k = k0; k < k1; k++)
                    s = fmaf(kwk_bf16_to_f32(h[(size_t)k * KWK_PANEL_ROWS]), xt[k], s);
                *yr = k0 == 0 ? s : *yr + s;
            }
        }
}
