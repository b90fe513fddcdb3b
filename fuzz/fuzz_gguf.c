/* fuzz_gguf.c - libFuzzer target: kwk_gguf_parse on arbitrary bytes, then every getter on every
 * key, the configuration reader, and the first row of each small tensor dequantized. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static void touch_kv(const struct kwk_gguf *g, const struct kwk_gguf_kv *kv)
{
    int64_t i;
    double d;
    int b;
    const char *s;
    size_t n;
    kwk_gguf_get_i64(g, kv->key, &i);
    kwk_gguf_get_f64(g, kv->key, &d);
    kwk_gguf_get_bool(g, kv->key, &b);
    if (kwk_gguf_get_str(g, kv->key, &s, &n) == 0 && n)
        b ^= s[n - 1];
    if (kv->type != KWK_GGUF_ARRAY)
        return;
    if (kv->arr_len) {
        kwk_gguf_arr_i64(kv, 0, &i);
        kwk_gguf_arr_f64(kv, kv->arr_len - 1, &d);
    }
    kwk_gguf_arr_i64(kv, kv->arr_len, &i);
    if (kv->arr_type == KWK_GGUF_STRING && kv->arr_len > 0 && kv->arr_len < (1u << 20)) {
        const char **ptrs = malloc(sizeof *ptrs * (size_t)kv->arr_len);
        size_t *lens = malloc(sizeof *lens * (size_t)kv->arr_len);
        if (ptrs && lens && kwk_gguf_arr_strings(kv, ptrs, lens) == 0) {
            volatile char sink = 0;
            for (uint64_t k = 0; k < kv->arr_len; k++)
                if (lens[k])
                    sink ^= ptrs[k][lens[k] - 1];
            (void)sink;
        }
        free(ptrs);
        free(lens);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1 << 20))
        return 0;
    struct kwk_gguf g;
    struct kwk_err err;
    if (kwk_gguf_parse(&g, data, size, "fuzz", &err) != 0)
        return 0;
    static char label[] = "fuzz";
    g.path = label; /* borrowed for the config reader's messages; cleared before close */
    for (int64_t i = 0; i < g.n_kv; i++)
        touch_kv(&g, &g.kv[i]);
    struct kwk_config cfg;
    kwk_config_from_gguf(&cfg, &g, &err);
    float row[4096];
    for (int i = 0; i < g.n_tensors; i++) {
        const struct kwk_tensor_ref *t = &g.tensors[i];
        int64_t cols = t->shape[t->n_dims - 1];
        if (cols <= (int64_t)(sizeof row / sizeof row[0]))
            kwk_dequant_row(t->dtype, t->data, row, cols);
    }
    g.path = NULL;
    kwk_gguf_close(&g);
    return 0;
}
