/* fuzz_gguf.c - libFuzzer target: kwk_gguf_parse on arbitrary bytes, then every getter on every
 * key, the configuration reader, the first row of each small tensor dequantized, and, for a file
 * with tokenizer.ggml.model, the tokenizer it holds (written to a file of this process's and
 * loaded by kwk_tokenizer_load: tok_gguf.c's vocabulary reader), which must load or fail, and
 * round-trips a text when it loads. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_roundtrip.h"
#include "model/model.h"

static char path[4096];

/* The harness's own failures (no file, a full disk) stop the run: a replay that tested nothing
 * must not pass. */
static void harness_fail(const char *what)
{
    fprintf(stderr, "fuzz_gguf: %s %s\n", what, path);
    abort();
}

static void cleanup(void)
{
    unlink(path);
}

/* The input as a .gguf file (made once a process, removed at exit), its tokenizer loaded. */
static void use_tokenizer(const uint8_t *data, size_t size)
{
    if (!path[0]) {
        setenv("KWKER_LOG", "error", 0);
        const char *tmp = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/kwk_fuzz_gguf.XXXXXX.gguf", tmp && *tmp ? tmp : "/tmp");
        int fd = mkstemps(path, 5);
        if (fd < 0)
            harness_fail("cannot create");
        close(fd);
        atexit(cleanup);
    }
    FILE *f = fopen(path, "wb");
    if (!f)
        harness_fail("cannot open");
    int ok = fwrite(data, 1, size, f) == size;
    if (fclose(f) != 0 || !ok)
        harness_fail("cannot write");
    struct kwk_err err;
    kwk_tokenizer *t = kwk_tokenizer_load(path, &err);
    if (t) {
        static const char text[] = " Hello  w\xc3\xb6rld\n<s>12 \xe2\x96\x81x</s>";
        fuzz_roundtrip(t, text, sizeof text - 1);
        kwk_tokenizer_free(t);
    }
}

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
    int has_tok = kwk_gguf_find(&g, "tokenizer.ggml.model") != NULL;
    g.path = NULL;
    kwk_gguf_close(&g);
    if (has_tok)
        use_tokenizer(data, size);
    return 0;
}
