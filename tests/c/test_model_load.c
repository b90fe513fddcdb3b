/* test_model_load.c - whole-model loading: a tiny Llama folder written here (config.json +
 * safetensors), its broken variants (missing tensor, wrong shape, unsupported architecture),
 * shards, tied embeddings, a tiny GGUF with llama.cpp's q/k row order, and Hugging Face cache
 * lookup on a fake cache tree. Single-threaded. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "test.h"

/* The tiny model: vocab 16, d 8, 2 layers, 2 heads of 4, 1 kv head, ff 12. */
enum { V = 16, D = 8, NL = 2, NH = 2, NKV = 1, HD = 4, FF = 12 };

static char root[256];

struct tdef {
    char name[96];
    const char *dtype; /* F32, BF16, F16 */
    int n_dims;
    int64_t shape[2];
};

/* Value k of tensor t: small multiples of 1/16, exact in bf16. */
static float tval(int t, int64_t k)
{
    return (float)((t * 7 + k) % 23 - 11) / 16.0f;
}

static size_t tdef_count(const struct tdef *d)
{
    return (size_t)d->shape[0] * (size_t)(d->n_dims == 2 ? d->shape[1] : 1);
}

static size_t tdef_esize(const struct tdef *d)
{
    return strcmp(d->dtype, "F32") ? 2 : 4;
}

static void put_elem(uint8_t *p, const struct tdef *d, int t, int64_t k)
{
    float v = tval(t, k);
    if (!strcmp(d->dtype, "F32")) {
        memcpy(p, &v, 4);
    } else if (!strcmp(d->dtype, "BF16")) {
        uint32_t u;
        memcpy(&u, &v, 4);
        p[0] = (uint8_t)(u >> 16);
        p[1] = (uint8_t)(u >> 24);
    } else { /* F16: norms only, alternating 1.0 and 0.5 */
        uint16_t h = k % 2 ? 0x3800 : 0x3c00;
        p[0] = (uint8_t)h;
        p[1] = (uint8_t)(h >> 8);
    }
}

/* Write tensors [first, last) of defs to path; global indices keep values stable across shards. */
static void write_st(const char *path, const struct tdef *defs, int first, int last)
{
    char *json = malloc(65536);
    size_t off = 0, jl = 0;
    jl += (size_t)sprintf(json + jl, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = first; i < last; i++) {
        size_t nb = tdef_count(&defs[i]) * tdef_esize(&defs[i]);
        jl += (size_t)sprintf(json + jl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", defs[i].name,
                              defs[i].dtype, (long long)defs[i].shape[0]);
        if (defs[i].n_dims == 2)
            jl += (size_t)sprintf(json + jl, ",%lld", (long long)defs[i].shape[1]);
        jl += (size_t)sprintf(json + jl, "],\"data_offsets\":[%zu,%zu]}", off, off + nb);
        off += nb;
    }
    jl += (size_t)sprintf(json + jl, "}");
    while ((8 + jl) % 8)
        json[jl++] = ' ';
    FILE *f = fopen(path, "wb");
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)jl >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(json, 1, jl, f);
    for (int i = first; i < last; i++) {
        uint8_t e[4];
        for (size_t k = 0; k < tdef_count(&defs[i]); k++) {
            put_elem(e, &defs[i], i, (int64_t)k);
            fwrite(e, 1, tdef_esize(&defs[i]), f);
        }
    }
    fclose(f);
    free(json);
}

static int add(struct tdef *defs, int n, const char *name, const char *dt, int64_t r, int64_t c)
{
    snprintf(defs[n].name, sizeof defs[n].name, "%s", name);
    defs[n].dtype = dt;
    defs[n].n_dims = c ? 2 : 1;
    defs[n].shape[0] = r;
    defs[n].shape[1] = c;
    return n + 1;
}

/* All tensors of the tiny Llama; lm_head last (so a tied model can drop it). */
static int llama_defs(struct tdef *defs)
{
    int n = 0;
    char nm[96];
    n = add(defs, n, "model.embed_tokens.weight", "BF16", V, D);
    for (int l = 0; l < NL; l++) {
        struct { const char *s, *dt; int64_t r, c; } t[] = {
            {"input_layernorm.weight", "F16", D, 0},
            {"self_attn.q_proj.weight", "F32", NH * HD, D},
            {"self_attn.k_proj.weight", "F32", NKV * HD, D},
            {"self_attn.v_proj.weight", "BF16", NKV * HD, D},
            {"self_attn.o_proj.weight", "F32", D, NH * HD},
            {"post_attention_layernorm.weight", "F32", D, 0},
            {"mlp.gate_proj.weight", "F32", FF, D},
            {"mlp.up_proj.weight", "F32", FF, D},
            {"mlp.down_proj.weight", "F32", D, FF},
        };
        for (size_t i = 0; i < KWK_ARRAY_LEN(t); i++) {
            snprintf(nm, sizeof nm, "model.layers.%d.%s", l, t[i].s);
            n = add(defs, n, nm, t[i].dt, t[i].r, t[i].c);
        }
    }
    n = add(defs, n, "model.norm.weight", "F32", D, 0);
    n = add(defs, n, "lm_head.weight", "F32", V, D);
    return n;
}

static const char *llama_config =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"vocab_size\":16,"
    "\"hidden_size\":8,\"num_hidden_layers\":2,\"num_attention_heads\":2,"
    "\"num_key_value_heads\":1,\"intermediate_size\":12,\"max_position_embeddings\":64,"
    "\"rms_norm_eps\":1e-05,\"rope_theta\":500000.0,\"tie_word_embeddings\":%s,"
    "\"bos_token_id\":1,\"eos_token_id\":2,\"hidden_act\":\"silu\"%s}";

static void write_text(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void write_config(const char *dir, const char *tie, const char *extra)
{
    char cfg[2048];
    snprintf(cfg, sizeof cfg, llama_config, tie, extra);
    write_text(dir, "config.json", cfg);
}

/* A fresh model folder under root. */
static void make_dir(char *dir, size_t cap, const char *name)
{
    snprintf(dir, cap, "%s/%s", root, name);
    mkdir(dir, 0755);
}

static int64_t expected_params(int tied)
{
    int64_t layer = 2 * D + (int64_t)NH * HD * D * 2 + 2 * (int64_t)NKV * HD * D + 3LL * FF * D;
    return (int64_t)V * D * (tied ? 1 : 2) + D + NL * layer;
}

/* KiB of path's pages mapped into this process (Rss summed over its mappings in
 * /proc/self/smaps; -1 when that cannot be read). */
static long mapped_kib(const char *path)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[1024];
    long kib = 0;
    int mine = 0;
    size_t n = strlen(path);
    while (fgets(line, sizeof line, f)) {
        long v;
        char *slash = strchr(line, '/');
        if (strchr(line, '-') == line + strspn(line, "0123456789abcdef")) /* a mapping's line */
            mine = slash && !strncmp(slash, path, n) && slash[n] == '\n';
        else if (mine && sscanf(line, "Rss: %ld kB", &v) == 1)
            kib += v;
    }
    fclose(f);
    return kib;
}

static void test_folder(void)
{
    char dir[512], path[600];
    struct tdef defs[64];
    int n = llama_defs(defs);
    make_dir(dir, sizeof dir, "llama");
    write_config(dir, "false", "");
    write_text(dir, "generation_config.json", "{\"eos_token_id\": [2, 5], \"bos_token_id\": 1}");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_st(path, defs, 0, n);
    struct kwk_err err;
    kwk_model *m = kwk_model_load(dir, &err);
    T_CHECK(m != NULL, "load: %s", err.msg);
    if (!m)
        return;
    /* the load read headers and norms through the mapping, and leaves none of its pages
     * mapped (on 2 MiB page cache folios each such read would keep a whole 2 MiB) */
    T_EQ(mapped_kib(path), 0);
    T_TRUE(m->n_st == 1 && m->st[0].map.size > 0 && m->st[0].map.data[8] == '{');
    T_TRUE(mapped_kib(path) > 0); /* the check sees a page read through the mapping */
    struct kwk_model_info info;
    kwk_model_get_info(m, &info);
    T_EQ(info.arch, KWK_ARCH_LLAMA);
    T_STREQ(info.arch_name, "LlamaForCausalLM");
    T_EQ(info.n_vocab, V);
    T_EQ(info.n_layers, NL);
    T_EQ(info.head_dim, HD);
    T_EQ(info.n_kv_heads, NKV);
    T_EQ(info.max_position, 64);
    T_EQ(info.bos_id, 1);
    T_EQ(info.n_eos, 2);
    T_EQ(info.eos_ids[1], 5);
    T_EQ(info.n_params, expected_params(0));
    T_NEAR(m->cfg.rope_theta, 500000.0, 0);
    T_NEAR(m->cfg.rms_eps, 1e-5, 1e-12);
    /* bf16 embeddings are used in place from the mapping */
    T_EQ(m->tok_emb.wtype, KWK_W_BF16);
    T_TRUE((const uint8_t *)m->tok_emb.data >= m->st[0].map.data &&
           (const uint8_t *)m->tok_emb.data < m->st[0].map.data + m->st[0].map.size);
    T_EQ(m->layers[1].wv.wtype, KWK_W_BF16);
    T_EQ(m->layers[1].wq.wtype, KWK_W_F32);
    T_EQ(m->layers[1].wq.rows, NH * HD);
    /* q_proj of layer 1 is tensor 1 + 9 + 1 */
    const float *wq = m->layers[1].wq.data;
    T_NEAR(wq[5], tval(11, 5), 0);
    T_NEAR(m->layers[0].attn_norm[0], 1.0, 0);
    T_NEAR(m->layers[0].attn_norm[1], 0.5, 0);
    T_NEAR(m->layers[0].ffn_norm[3], tval(6, 3), 0);
    T_TRUE(m->layers[0].bq == NULL && m->layers[0].q_norm == NULL);
    T_TRUE(m->lm_head.data != m->tok_emb.data);
    kwk_model_free(m);
    kwk_model_free(NULL);

    /* every allocation of the load failing in turn: an error naming the cause, no leak */
    int oom_ok = 1, k;
    for (k = 1; k < 400; k++) {
        kwk_alloc_fail_after(k);
        m = kwk_model_load(dir, &err);
        kwk_alloc_fail_after(0);
        if (m) {
            kwk_model_free(m);
            break;
        }
        if (!strstr(err.msg, "out of memory")) {
            fprintf(stderr, "allocation %d: %s\n", k, err.msg);
            oom_ok = 0;
        }
    }
    T_TRUE(oom_ok);
    T_TRUE(k > 5 && k < 400);

    char reason[256];
    T_EQ(kwk_model_check(dir, 128, reason, sizeof reason), 0);
    T_STREQ(reason, "");
    T_EQ(kwk_model_check(dir, -1, reason, sizeof reason), KWK_EARG);
    T_EQ(kwk_model_check(path, 16, reason, sizeof reason), KWK_EARG);
    T_CONTAINS(reason, "pass the model folder");
}

static void expect_fail(const char *dir, int code, const char *needle)
{
    struct kwk_err err;
    kwk_model *m = kwk_model_load(dir, &err);
    T_TRUE(m == NULL);
    kwk_model_free(m);
    T_EQ(err.code, code);
    T_CONTAINS(err.msg, needle);
}

static void test_broken(void)
{
    char dir[512], path[600];
    struct tdef defs[64];
    int n = llama_defs(defs);

    /* a missing tensor: drop layer 1's up_proj (index 1 + 9 + 7) */
    make_dir(dir, sizeof dir, "missing");
    write_config(dir, "false", "");
    struct tdef less[64];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(defs[i].name, "model.layers.1.mlp.up_proj.weight"))
            less[k++] = defs[i];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_st(path, less, 0, k);
    expect_fail(dir, KWK_ENOTFOUND, "model.layers.1.mlp.up_proj.weight is missing");
    expect_fail(dir, KWK_ENOTFOUND, dir);

    /* a wrong shape */
    make_dir(dir, sizeof dir, "shape");
    write_config(dir, "false", "");
    struct tdef bad[64];
    memcpy(bad, defs, sizeof bad);
    for (int i = 0; i < n; i++)
        if (!strcmp(bad[i].name, "model.layers.0.mlp.up_proj.weight"))
            bad[i].shape[0] = 10;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_st(path, bad, 0, n);
    expect_fail(dir, KWK_EFORMAT,
                "model.layers.0.mlp.up_proj.weight: shape [10, 8] but config needs [12, 8]");
    expect_fail(dir, KWK_EFORMAT, path);

    /* not tied and no lm_head */
    make_dir(dir, sizeof dir, "nohead");
    write_config(dir, "false", "");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_st(path, defs, 0, n - 1);
    expect_fail(dir, KWK_ENOTFOUND, "lm_head.weight is missing");

    /* tied: no lm_head needed */
    write_config(dir, "true", "");
    struct kwk_err err;
    kwk_model *m = kwk_model_load(dir, &err);
    T_CHECK(m != NULL, "tied: %s", err.msg);
    if (m) {
        T_TRUE(m->lm_head.data == m->tok_emb.data);
        T_EQ(m->n_params, expected_params(1));
        kwk_model_free(m);
    }

    /* unsupported architecture and options: a reason, from check and from load */
    make_dir(dir, sizeof dir, "gpt2");
    write_text(dir, "config.json", "{\"architectures\":[\"GPT2LMHeadModel\"],\"vocab_size\":50,"
               "\"n_embd\":8}");
    char reason[256];
    T_EQ(kwk_model_check(dir, 0, reason, sizeof reason), KWK_EUNSUPPORTED);
    T_CONTAINS(reason, "architecture GPT2LMHeadModel is not supported (supported: Llama, "
               "Mistral, Qwen2, Qwen3, Gemma3ForCausalLM; encoders: BERT, RoBERTa, XLM-RoBERTa)");
    expect_fail(dir, KWK_EUNSUPPORTED, "architecture GPT2LMHeadModel is not supported");
    make_dir(dir, sizeof dir, "yarn");
    write_config(dir, "false", ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0}");
    T_EQ(kwk_model_check(dir, 0, reason, sizeof reason), KWK_EUNSUPPORTED);
    T_CONTAINS(reason, "rope scaling type \"yarn\" is not supported");
    write_config(dir, "false", ",\"hidden_act\":\"gelu\"");
    T_EQ(kwk_model_check(dir, 0, reason, sizeof reason), KWK_EUNSUPPORTED); /* last key wins */
    T_CONTAINS(reason, "hidden_act gelu is not supported");
    write_config(dir, "false", ",\"mlp_bias\":true");
    T_EQ(kwk_model_check(dir, 0, reason, sizeof reason), KWK_EUNSUPPORTED);
    T_CONTAINS(reason, "mlp_bias");
    write_config(dir, "false", ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
                 "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                 "\"original_max_position_embeddings\":8192}");
    struct kwk_config cfg;
    T_EQ(kwk_config_load_dir(&cfg, dir, &err), 0);
    T_EQ(cfg.rope_type, KWK_ROPE_LLAMA3);
    T_NEAR(cfg.rope_factor, 8.0, 0);
    T_NEAR(cfg.rope_high_freq_factor, 4.0, 0);
    T_EQ(cfg.rope_orig_max_position, 8192);
    T_STREQ(cfg.unsupported, "");
    write_text(dir, "config.json", "{\"architectures\":[\"LlamaForCausalLM\"], \"vocab_size\":");
    T_EQ(kwk_model_check(dir, 0, reason, sizeof reason), KWK_EFORMAT);
    T_CONTAINS(reason, "config.json: invalid JSON at line 1");
    write_text(dir, "config.json", "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":8}");
    T_EQ(kwk_model_check(dir, 0, reason, sizeof reason), KWK_EFORMAT);
    T_CONTAINS(reason, "\"num_hidden_layers\" is missing");
    snprintf(path, sizeof path, "%s/none", root);
    T_EQ(kwk_model_check(path, 0, reason, sizeof reason), KWK_ENOTFOUND);
    T_CONTAINS(reason, path);
    make_dir(dir, sizeof dir, "noweights");
    write_config(dir, "false", "");
    expect_fail(dir, KWK_ENOTFOUND, "no model.safetensors");
}

static void test_sharded(void)
{
    char dir[512], path[600];
    struct tdef defs[64];
    int n = llama_defs(defs);
    make_dir(dir, sizeof dir, "sharded");
    write_config(dir, "false", "");
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    write_st(path, defs, 0, 7);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    write_st(path, defs, 7, n);
    static char index[16384];
    size_t k = (size_t)snprintf(index, sizeof index, "{\"metadata\":{},\"weight_map\":{");
    for (int i = 0; i < n && k < sizeof index; i++)
        k += (size_t)snprintf(index + k, sizeof index - k,
                              "%s\"%s\":\"model-0000%d-of-00002.safetensors\"", i ? "," : "",
                              defs[i].name, i < 7 ? 1 : 2);
    if (k < sizeof index)
        snprintf(index + k, sizeof index - k, "}}");
    write_text(dir, "model.safetensors.index.json", index);
    struct kwk_err err;
    kwk_model *m = kwk_model_load(dir, &err);
    T_CHECK(m != NULL, "sharded: %s", err.msg);
    if (m) {
        T_EQ(m->n_st, 2);
        T_NEAR(((const float *)m->layers[1].wq.data)[5], tval(11, 5), 0);
        kwk_model_free(m);
    }
    /* without the index every *.safetensors is read */
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    unlink(path);
    m = kwk_model_load(dir, &err);
    T_CHECK(m != NULL, "sharded without index: %s", err.msg);
    kwk_model_free(m);
}

/* ---- a tiny GGUF with llama.cpp's names and q/k row order ----------------------------------*/

struct gb {
    uint8_t *p;
    size_t n, cap;
};

static void gb_bytes(struct gb *b, const void *s, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void gb_le(struct gb *b, uint64_t v, int n)
{
    uint8_t t[8];
    for (int i = 0; i < n; i++)
        t[i] = (uint8_t)(v >> (8 * i));
    gb_bytes(b, t, (size_t)n);
}

static void gb_str(struct gb *b, const char *s)
{
    gb_le(b, strlen(s), 8);
    gb_bytes(b, s, strlen(s));
}

static void gb_kv_u32(struct gb *b, const char *k, uint32_t v)
{
    gb_str(b, k);
    gb_le(b, KWK_GGUF_UINT32, 4);
    gb_le(b, v, 4);
}

static void gb_kv_f32(struct gb *b, const char *k, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    gb_str(b, k);
    gb_le(b, KWK_GGUF_FLOAT32, 4);
    gb_le(b, u, 4);
}

struct gt {
    char name[64];
    int64_t rows, cols; /* cols = ne[0]; rows = 0 for vectors */
    int hf;             /* index of the HF-order values; q/k are stored permuted */
    int permute_heads;
};

static size_t gt_bytes(const struct gt *t)
{
    int64_t rows = t->rows ? t->rows : 1;
    return (size_t)rows * (size_t)t->cols * 4;
}

/* HF-order value (r, c) of tensor t. */
static float gval(const struct gt *t, int64_t r, int64_t c)
{
    return tval(t->hf, r * t->cols + c);
}

static void gt_data(struct gb *b, const struct gt *t)
{
    int64_t rows = t->rows ? t->rows : 1;
    for (int64_t r = 0; r < rows; r++) {
        int64_t src = r;
        if (t->permute_heads) { /* file row (h, i, j) holds HF row (h, j, i) */
            int64_t per = rows / t->permute_heads, h = r / per, k = r % per;
            src = h * per + (k % 2) * (per / 2) + k / 2;
        }
        for (int64_t c = 0; c < t->cols; c++) {
            float v = gval(t, src, c);
            gb_bytes(b, &v, 4);
        }
    }
}

static void write_gguf(const char *path, int drop_output)
{
    struct gt ts[64];
    int n = 0;
    struct gt base = {{0}, V, D, 0, 0};
    ts[n] = base;
    strcpy(ts[n++].name, "token_embd.weight");
    for (int l = 0; l < NL; l++) {
        struct { const char *s; int64_t r, c; int perm; } d[] = {
            {"attn_norm.weight", 0, D, 0}, {"attn_q.weight", NH * HD, D, NH},
            {"attn_k.weight", NKV * HD, D, NKV}, {"attn_v.weight", NKV * HD, D, 0},
            {"attn_output.weight", D, NH * HD, 0}, {"ffn_norm.weight", 0, D, 0},
            {"ffn_gate.weight", FF, D, 0}, {"ffn_up.weight", FF, D, 0},
            {"ffn_down.weight", D, FF, 0}};
        for (size_t i = 0; i < KWK_ARRAY_LEN(d); i++) {
            snprintf(ts[n].name, sizeof ts[n].name, "blk.%d.%s", l, d[i].s);
            ts[n].rows = d[i].r;
            ts[n].cols = d[i].c;
            ts[n].hf = n;
            ts[n].permute_heads = d[i].perm;
            n++;
        }
    }
    ts[n] = base;
    ts[n].rows = 0;
    ts[n].cols = D;
    ts[n].hf = n;
    strcpy(ts[n++].name, "output_norm.weight");
    if (!drop_output) {
        ts[n] = base;
        ts[n].hf = n;
        strcpy(ts[n++].name, "output.weight");
    }
    struct gb b = {0};
    gb_bytes(&b, "GGUF", 4);
    gb_le(&b, 3, 4);
    gb_le(&b, (uint64_t)n, 8);
    gb_le(&b, 10, 8);
    gb_str(&b, "general.architecture");
    gb_le(&b, KWK_GGUF_STRING, 4);
    gb_str(&b, "llama");
    gb_kv_u32(&b, "llama.block_count", NL);
    gb_kv_u32(&b, "llama.embedding_length", D);
    gb_kv_u32(&b, "llama.attention.head_count", NH);
    gb_kv_u32(&b, "llama.attention.head_count_kv", NKV);
    gb_kv_u32(&b, "llama.feed_forward_length", FF);
    gb_kv_u32(&b, "llama.context_length", 64);
    gb_kv_f32(&b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gb_kv_f32(&b, "llama.rope.freq_base", 10000.0f);
    gb_kv_u32(&b, "tokenizer.ggml.eos_token_id", 2);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        gb_str(&b, ts[i].name);
        gb_le(&b, ts[i].rows ? 2 : 1, 4);
        gb_le(&b, (uint64_t)ts[i].cols, 8);
        if (ts[i].rows)
            gb_le(&b, (uint64_t)ts[i].rows, 8);
        gb_le(&b, 0, 4); /* F32 */
        gb_le(&b, off, 8);
        off += (gt_bytes(&ts[i]) + 31) / 32 * 32;
    }
    for (int i = 0; i < n; i++) {
        while (b.n % 32)
            gb_le(&b, 0, 1);
        gt_data(&b, &ts[i]);
    }
    while (b.n % 32)
        gb_le(&b, 0, 1);
    FILE *f = fopen(path, "wb");
    fwrite(b.p, 1, b.n, f);
    fclose(f);
    free(b.p);
}

static void test_gguf_model(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tiny.gguf", root);
    write_gguf(path, 0);
    struct kwk_err err;
    kwk_model *m = kwk_model_load(path, &err);
    T_CHECK(m != NULL, "gguf: %s", err.msg);
    if (!m)
        return;
    T_EQ(mapped_kib(path), 0); /* as for a folder: metadata and norms read, nothing left mapped */
    struct kwk_model_info info;
    kwk_model_get_info(m, &info);
    T_STREQ(info.arch_name, "llama");
    T_EQ(info.n_vocab, V);
    T_EQ(info.head_dim, HD);
    T_EQ(info.n_eos, 1);
    T_EQ(info.eos_ids[0], 2);
    T_EQ(info.n_params, expected_params(0));
    /* q and k come back in Hugging Face row order; tensor 2 is blk.0.attn_q, 3 blk.0.attn_k
     * (float copies: made on demand, so held while read) */
    T_EQ(kwk_model_floats_acquire(m, &err), 0);
    const float *wq = m->layers[0].wq.data, *wk = m->layers[0].wk.data;
    int ok = m->layers[0].wq.wtype == KWK_W_F32 && m->layers[0].wk.wtype == KWK_W_F32;
    for (int r = 0; r < NH * HD; r++)
        for (int c = 0; c < D; c++)
            ok &= wq[r * D + c] == tval(2, r * D + c);
    for (int r = 0; r < NKV * HD; r++)
        for (int c = 0; c < D; c++)
            ok &= wk[r * D + c] == tval(3, r * D + c);
    T_TRUE(ok);
    /* v is not permuted and is used in place */
    T_TRUE((const uint8_t *)m->layers[0].wv.data >= m->gguf->map.data &&
           (const uint8_t *)m->layers[0].wv.data < m->gguf->map.data + m->gguf->map.size);
    T_NEAR(((const float *)m->layers[0].wv.data)[3], tval(4, 3), 0);
    T_NEAR(m->layers[1].attn_norm[2], tval(10, 2), 0);
    kwk_model_floats_release(m);
    kwk_model_free(m);

    write_gguf(path, 1);
    m = kwk_model_load(path, &err);
    T_CHECK(m != NULL, "gguf tied: %s", err.msg);
    if (m) {
        T_TRUE(m->lm_head.data == m->tok_emb.data);
        kwk_model_free(m);
    }
    char reason[256];
    T_EQ(kwk_model_check(path, 32, reason, sizeof reason), 0);
    /* a truncated GGUF names the file */
    T_EQ(truncate(path, 600), 0);
    m = kwk_model_load(path, &err);
    T_TRUE(m == NULL);
    T_CONTAINS(err.msg, path);
    T_EQ(kwk_model_check(path, 32, reason, sizeof reason), KWK_EFORMAT);
}

/* ---- Gemma 3's config -------------------------------------------------------------------- */

static const char *gemma3_head =
    "{\"architectures\":[\"Gemma3ForCausalLM\"],\"model_type\":\"gemma3_text\","
    "\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":8,\"num_attention_heads\":2,"
    "\"num_key_value_heads\":1,\"head_dim\":4,\"intermediate_size\":12,"
    "\"rms_norm_eps\":1e-06,\"sliding_window\":3";

/* config.json = gemma3_head + extra + "}" in a folder of its own; its config into cfg. */
static int gemma3_cfg(const char *name, const char *extra, struct kwk_config *cfg,
                      struct kwk_err *err)
{
    char dir[512], text[2048];
    make_dir(dir, sizeof dir, name);
    snprintf(text, sizeof text, "%s%s}", gemma3_head, extra);
    write_text(dir, "config.json", text);
    return kwk_config_load_dir(cfg, dir, err);
}

/* Layers 0..n_layers-1 as a string of 'L' (local: window and local rotary) and 'G'. */
static void layer_kinds(const struct kwk_config *c, char *out)
{
    for (int L = 0; L < c->n_layers; L++) {
        int w = kwk_config_layer_windowed(c, L), r = kwk_config_layer_local_rope(c, L);
        out[L] = w && r ? 'L' : !w && !r ? 'G' : '?';
    }
    out[c->n_layers] = 0;
}

static void test_gemma3_config(void)
{
    struct kwk_config c;
    struct kwk_err err;
    char kinds[16];
    /* transformers 5: layer_types and rope parameters per layer type */
    T_EQ(gemma3_cfg("g3_v5", ",\"layer_types\":[\"sliding_attention\",\"full_attention\","
                    "\"sliding_attention\",\"sliding_attention\",\"full_attention\","
                    "\"full_attention\",\"sliding_attention\",\"sliding_attention\"],"
                    "\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"linear\","
                    "\"factor\":8.0,\"rope_theta\":1000000.0},\"sliding_attention\":"
                    "{\"rope_type\":\"default\",\"rope_theta\":10000.0}},"
                    "\"query_pre_attn_scalar\":16", &c, &err), 0);
    T_STREQ(c.unsupported, "");
    T_EQ(c.arch, KWK_ARCH_GEMMA3);
    layer_kinds(&c, kinds);
    T_STREQ(kinds, "LGLLGGLL");
    T_NEAR(c.rope_theta, 1e6, 0);
    T_NEAR(c.rope_theta_local, 1e4, 0);
    T_EQ(c.rope_type, KWK_ROPE_LINEAR);
    T_NEAR(c.rope_factor, 8.0, 0);
    T_NEAR(c.attn_scale, 0.25, 0);          /* 16^-1/2, not head_dim's 4^-1/2 */
    T_NEAR(c.embed_scale, sqrtf(8.0f), 0);
    T_EQ(c.act, KWK_ACT_GELU_TANH);
    T_TRUE(c.qk_norm && c.post_norms && c.norm_plus_one && c.tie_embeddings);
    T_EQ(c.sliding_window, 3);
    T_EQ(c.max_position, 131072);

    /* transformers 4.50: a pattern, rope_theta and rope_local_base_freq, no layer_types */
    T_EQ(gemma3_cfg("g3_legacy", ",\"sliding_window_pattern\":3,\"rope_theta\":500000.0,"
                    "\"rope_local_base_freq\":20000.0,\"rope_scaling\":null,"
                    "\"tie_word_embeddings\":false", &c, &err), 0);
    layer_kinds(&c, kinds);
    T_STREQ(kinds, "LLGLLGLL");
    T_NEAR(c.rope_theta_local, 2e4, 0);
    T_NEAR(c.attn_scale, 1.0f / 16.0f, 0);  /* query_pre_attn_scalar's default, 256 */
    T_EQ(c.tie_embeddings, 0);
    /* transformers 4.55 writes its attribute, and the pattern argument wins over it */
    T_EQ(gemma3_cfg("g3_attr", ",\"_sliding_window_pattern\":4", &c, &err), 0);
    layer_kinds(&c, kinds);
    T_STREQ(kinds, "LLLGLLLG");
    T_EQ(gemma3_cfg("g3_both", ",\"_sliding_window_pattern\":4,\"sliding_window_pattern\":2", &c,
                    &err), 0);
    layer_kinds(&c, kinds);
    T_STREQ(kinds, "LGLGLGLG");

    /* what Kwker does not run is a reason, not an error */
    T_EQ(gemma3_cfg("g3_cap", ",\"final_logit_softcapping\":30.0", &c, &err), 0);
    T_CONTAINS(c.unsupported, "final_logit_softcapping");
    T_EQ(gemma3_cfg("g3_act", ",\"hidden_activation\":\"relu\"", &c, &err), 0);
    T_CONTAINS(c.unsupported, "relu");
    T_EQ(gemma3_cfg("g3_bidir", ",\"use_bidirectional_attention\":true", &c, &err), 0);
    T_CONTAINS(c.unsupported, "bidirectional");
    char dir[512];
    make_dir(dir, sizeof dir, "g3_mm");
    write_text(dir, "config.json", "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],"
               "\"model_type\":\"gemma3\"}");
    T_EQ(kwk_config_load_dir(&c, dir, &err), 0);
    T_CONTAINS(c.unsupported, "Gemma3ForCausalLM");

    /* malformed: errors name the file and the key */
    T_EQ(gemma3_cfg("g3_short", ",\"layer_types\":[\"full_attention\"]", &c, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "layer_types");
    T_CONTAINS(err.msg, "g3_short/config.json");
    T_EQ(gemma3_cfg("g3_kind", ",\"layer_types\":[\"full_attention\",\"full_attention\","
                    "\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\","
                    "\"full_attention\",\"chunked_attention\"]", &c, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "layer_types[7]");
    T_EQ(gemma3_cfg("g3_pat", ",\"sliding_window_pattern\":0", &c, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "sliding_window_pattern");
    T_EQ(gemma3_cfg("g3_qpas", ",\"query_pre_attn_scalar\":-4", &c, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "query_pre_attn_scalar");
    T_EQ(gemma3_cfg("g3_local", ",\"rope_local_base_freq\":0", &c, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "local rope base");
}

/* A gemma3 GGUF's metadata: llama.cpp's pattern (every sixth layer global), base 10000 for the
 * local layers unless the file names one, 1/sqrt(key_length) as the softmax scale. */
static int gemma3_gguf_config(struct kwk_config *cfg, int n_layers, int swa_base)
{
    struct gb b = {0};
    gb_bytes(&b, "GGUF", 4);
    gb_le(&b, 3, 4);
    gb_le(&b, 0, 8);
    gb_le(&b, swa_base ? 11 : 10, 8);
    gb_str(&b, "general.architecture");
    gb_le(&b, KWK_GGUF_STRING, 4);
    gb_str(&b, "gemma3");
    gb_kv_u32(&b, "gemma3.block_count", (uint32_t)n_layers);
    gb_kv_u32(&b, "gemma3.embedding_length", 640);
    gb_kv_u32(&b, "gemma3.attention.head_count", 4);
    gb_kv_u32(&b, "gemma3.attention.head_count_kv", 1);
    gb_kv_u32(&b, "gemma3.attention.key_length", 256);
    gb_kv_u32(&b, "gemma3.feed_forward_length", 2048);
    gb_kv_u32(&b, "gemma3.attention.sliding_window", 512);
    gb_kv_u32(&b, "gemma3.vocab_size", 262144);
    gb_kv_f32(&b, "gemma3.rope.freq_base", 1000000.0f);
    if (swa_base)
        gb_kv_f32(&b, "gemma3.rope.freq_base_swa", (float)swa_base);
    struct kwk_gguf g;
    struct kwk_err err;
    int rc = kwk_gguf_parse(&g, b.p, b.n, "g3.gguf", &err);
    if (rc == 0) {
        rc = kwk_config_from_gguf(cfg, &g, &err);
        kwk_gguf_close(&g);
    }
    T_CHECK(rc == 0, "gemma3 gguf: %s", err.msg);
    free(b.p);
    return rc;
}

static void test_gemma3_gguf_config(void)
{
    struct kwk_config c;
    char kinds[16];
    if (gemma3_gguf_config(&c, 8, 0))
        return;
    T_STREQ(c.unsupported, "");
    T_EQ(c.arch, KWK_ARCH_GEMMA3);
    layer_kinds(&c, kinds);
    T_STREQ(kinds, "LLLLLGLL");
    T_EQ(c.sliding_window, 512);
    T_NEAR(c.rope_theta_local, 1e4, 0);
    T_NEAR(c.attn_scale, 1.0f / 16.0f, 0);
    T_NEAR(c.embed_scale, sqrtf(640.0f), 0);
    T_TRUE(c.qk_norm && c.post_norms && !c.norm_plus_one); /* the converter added the 1 */
    T_EQ(c.act, KWK_ACT_GELU_TANH);
    if (gemma3_gguf_config(&c, 62, 20000))
        return;
    T_NEAR(c.rope_theta_local, 2e4, 0);
    T_NEAR(c.attn_scale, 1.0f / sqrtf(160.0f), 0); /* 27B: d_model / heads */
}

/* The divisors llama.cpp's converter writes for Llama 3 rope scaling. */
static double l3_ref(int i, int head_dim, double theta, double factor, double lo, double hi,
                     double old)
{
    double inv = 1.0 / pow(theta, (double)(2 * i) / head_dim), w = 2 * 3.14159265358979 / inv;
    if (w < old / hi)
        return 1.0;
    if (w > old / lo)
        return factor;
    double s = (old / w - lo) / (hi - lo);
    return 1.0 / ((1 - s) / factor + s);
}

/* Config of a GGUF with only metadata and rope_freqs.weight (head_dim 128, as Llama 3.2). */
static int l3_config(struct kwk_config *cfg, double factor, double old, int hd, int break_one)
{
    struct gb b = {0};
    int n = hd / 2;
    gb_bytes(&b, "GGUF", 4);
    gb_le(&b, 3, 4);
    gb_le(&b, 1, 8);
    gb_le(&b, 8, 8);
    gb_str(&b, "general.architecture");
    gb_le(&b, KWK_GGUF_STRING, 4);
    gb_str(&b, "llama");
    gb_kv_u32(&b, "llama.block_count", 1);
    gb_kv_u32(&b, "llama.embedding_length", (uint32_t)hd * 4);
    gb_kv_u32(&b, "llama.attention.head_count", 4);
    gb_kv_u32(&b, "llama.feed_forward_length", 64);
    gb_kv_u32(&b, "llama.vocab_size", 100);
    gb_kv_f32(&b, "llama.rope.freq_base", 500000.0f);
    gb_kv_u32(&b, "llama.attention.key_length", (uint32_t)hd);
    gb_str(&b, "rope_freqs.weight");
    gb_le(&b, 1, 4);
    gb_le(&b, (uint64_t)n, 8);
    gb_le(&b, 0, 4);
    gb_le(&b, 0, 8);
    while (b.n % 32)
        gb_le(&b, 0, 1);
    for (int i = 0; i < n; i++) {
        float v = (float)l3_ref(i, hd, 500000.0, factor, 1.0, 4.0, old);
        if (break_one && i == n / 2)
            v = 1.5f;
        gb_bytes(&b, &v, 4);
    }
    struct kwk_gguf g;
    struct kwk_err err;
    int rc = kwk_gguf_parse(&g, b.p, b.n, "l3.gguf", &err);
    if (rc == 0) {
        rc = kwk_config_from_gguf(cfg, &g, &err);
        kwk_gguf_close(&g);
    }
    T_CHECK(rc == 0, "l3: %s", err.msg);
    free(b.p);
    return rc;
}

static void test_llama3_rope(void)
{
    struct kwk_config c;
    /* enough blended divisors: the very parameters come back */
    if (l3_config(&c, 32.0, 8192, 128, 0) == 0) {
        T_STREQ(c.unsupported, "");
        T_EQ(c.rope_type, KWK_ROPE_LLAMA3);
        T_NEAR(c.rope_factor, 32.0, 1e-6);
        T_EQ(c.rope_orig_max_position, 8192);
        T_NEAR(c.rope_low_freq_factor, 1.0, 1e-4);
        T_NEAR(c.rope_high_freq_factor, 4.0, 1e-3);
    }
    /* few frequencies: other parameters, the same divisors */
    for (int hd = 4; hd <= 32; hd *= 2) {
        if (l3_config(&c, 8.0, 64, hd, 0) != 0)
            continue;
        T_STREQ(c.unsupported, "");
        int same = 1;
        for (int i = 0; i < hd / 2; i++) {
            double want = l3_ref(i, hd, 500000.0, 8.0, 1.0, 4.0, 64);
            double got = l3_ref(i, hd, 500000.0, c.rope_factor, c.rope_low_freq_factor,
                                c.rope_high_freq_factor, c.rope_orig_max_position);
            same &= fabs(got - want) <= 1e-5 * want;
        }
        T_CHECK(same, "head_dim %d: factor %g low %g high %g orig %d", hd, c.rope_factor,
                c.rope_low_freq_factor, c.rope_high_freq_factor, c.rope_orig_max_position);
    }
    /* divisors that are not llama3's: a reason, not a wrong rope */
    if (l3_config(&c, 32.0, 8192, 128, 1) == 0)
        T_CONTAINS(c.unsupported, "rope_freqs.weight is not Llama 3 rope scaling");
}

/* ---- Hugging Face cache lookup -------------------------------------------------------------*/

static void test_hf_cache(void)
{
    char hub[300], d[700], out[1024], cmd[4096];
    struct kwk_err err;
    snprintf(hub, sizeof hub, "%s/hub", root);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/models--org--tiny/refs %s/models--org--tiny/snapshots/"
             "abc123 %s/models--org--tiny/snapshots/old999 %s/models--org--one/snapshots/r1 && "
             "printf 'abc123\\n' > %s/models--org--tiny/refs/main && cp %s/llama/config.json "
             "%s/llama/model.safetensors %s/models--org--tiny/snapshots/abc123/", hub, hub, hub,
             hub, hub, root, root, hub);
    T_EQ(system(cmd), 0);
    setenv("HF_HUB_CACHE", hub, 1);
    T_EQ(kwk_hf_resolve("org/tiny", out, sizeof out, &err), 0);
    snprintf(d, sizeof d, "%s/models--org--tiny/snapshots/abc123", hub);
    T_STREQ(out, d);
    T_EQ(kwk_hf_resolve("org/one", out, sizeof out, &err), 0);
    snprintf(d, sizeof d, "%s/models--org--one/snapshots/r1", hub);
    T_STREQ(out, d);
    T_EQ(kwk_hf_resolve("org/absent", out, sizeof out, &err), KWK_ENOTFOUND);
    T_CONTAINS(err.msg, "models--org--absent");
    T_CONTAINS(err.msg, "never downloads");
    T_EQ(kwk_hf_resolve("not-an-id", out, sizeof out, &err), KWK_ENOTFOUND);
    T_EQ(kwk_hf_resolve(root, out, sizeof out, &err), 0);
    T_STREQ(out, root);
    T_EQ(kwk_hf_resolve(root, out, 4, &err), KWK_ELIMIT);
    /* HF_HOME/hub when HF_HUB_CACHE is unset */
    unsetenv("HF_HUB_CACHE");
    setenv("HF_HOME", root, 1);
    T_EQ(kwk_hf_resolve("org/one", out, sizeof out, &err), 0);
    kwk_model *m = kwk_model_load("org/tiny", &err);
    T_CHECK(m != NULL, "load by id: %s", err.msg);
    kwk_model_free(m);
    unsetenv("HF_HOME");
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/kwk_test_model_%d", (int)getpid());
    mkdir(root, 0755);
    test_folder();
    test_broken();
    test_sharded();
    test_gguf_model();
    test_llama3_rope();
    test_gemma3_config();
    test_gemma3_gguf_config();
    test_hf_cache();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return t_report("test_model_load");
}
