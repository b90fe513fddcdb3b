/* config.c - a model's hyperparameters from config.json (+ generation_config.json) or from GGUF
 * metadata, with what Kwker cannot run recorded as a reason rather than an error. Any thread. */
#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "model/model.h"

#define CFG_JSON_MAX ((size_t)4 << 20)
#define CFG_DIM_MAX (1 << 24)

/* Keep the first reason: it is usually the root cause. */
static void KWK_PRINTF(2, 3) cfg_unsupported(struct kwk_config *cfg, const char *fmt, ...)
{
    if (cfg->unsupported[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cfg->unsupported, sizeof cfg->unsupported, fmt, ap);
    va_end(ap);
}

static void cfg_defaults(struct kwk_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->rms_eps = 1e-6f;
    cfg->rope_theta = 10000.0f;
    cfg->rope_factor = 1.0f;
    cfg->bos_id = -1;
    cfg->embed_scale = 1.0f;
}

struct arch_name {
    const char *hf, *model_type;
    int arch;
};

static const struct arch_name archs[] = {
    {"LlamaForCausalLM", "llama", KWK_ARCH_LLAMA},
    {"MistralForCausalLM", "mistral", KWK_ARCH_MISTRAL},
    {"Qwen2ForCausalLM", "qwen2", KWK_ARCH_QWEN2},
    {"Qwen3ForCausalLM", "qwen3", KWK_ARCH_QWEN3},
    {"Gemma3ForCausalLM", "gemma3_text", KWK_ARCH_GEMMA3},
};

/* Sanity-check the numbers every later size computation relies on. */
static int cfg_validate(struct kwk_config *cfg, const char *label, struct kwk_err *err)
{
    struct { const char *name; int v; int max; } f[] = {
        {"vocab size", cfg->n_vocab, CFG_DIM_MAX},
        {"number of layers", cfg->n_layers, KWK_MAX_LAYERS},
        {"hidden size", cfg->d_model, CFG_DIM_MAX},
        {"number of attention heads", cfg->n_heads, 65536},
        {"number of key/value heads", cfg->n_kv_heads, 65536},
        {"head dim", cfg->head_dim, 65536},
        {"intermediate size", cfg->d_ff, CFG_DIM_MAX},
    };
    for (size_t i = 0; i < KWK_ARRAY_LEN(f); i++)
        if (f[i].v <= 0 || f[i].v > f[i].max)
            return kwk_err_set(err, KWK_EFORMAT, "%s: %s is %d (must be in 1..%d)", label,
                               f[i].name, f[i].v, f[i].max);
    if ((int64_t)cfg->n_heads * cfg->head_dim > CFG_DIM_MAX)
        return kwk_err_set(err, KWK_EFORMAT, "%s: heads x head dim too large", label);
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        cfg_unsupported(cfg, "num_attention_heads (%d) is not a multiple of "
                        "num_key_value_heads (%d)", cfg->n_heads, cfg->n_kv_heads);
    if (cfg->head_dim % 2 != 0 && !cfg->encoder)
        cfg_unsupported(cfg, "head dim %d is odd (rotary embeddings need pairs)", cfg->head_dim);
    /* an encoder's heads split its hidden size: its scratch and its attention assume it */
    if (cfg->encoder && ((int64_t)cfg->n_heads * cfg->head_dim != cfg->d_model ||
                         cfg->n_kv_heads != cfg->n_heads))
        return kwk_err_set(err, KWK_EFORMAT, "%s: an encoder's %d heads of %d (key / value "
                           "heads %d) must split its hidden size %d", label, cfg->n_heads,
                           cfg->head_dim, cfg->n_kv_heads, cfg->d_model);
    if (!(cfg->rms_eps > 0.0f) || !(cfg->rope_theta > 0.0f))
        return kwk_err_set(err, KWK_EFORMAT, "%s: rms_norm_eps and rope_theta must be positive",
                           label);
    if (cfg->max_position < 0)
        cfg->max_position = 0;
    if (cfg->attn_scale == 0.0f)
        cfg->attn_scale = 1.0f / sqrtf((float)cfg->head_dim);
    return 0;
}

/* Gemma 3's layer pattern: every pattern-th layer global, the others local (transformers'
 * default for configs without layer_types; llama.cpp's for GGUF files). */
static void cfg_window_pattern(struct kwk_config *cfg, int pattern)
{
    cfg->window_per_layer = 1;
    memset(cfg->layer_local, 0, sizeof cfg->layer_local);
    for (int L = 0; L < cfg->n_layers && L < KWK_MAX_LAYERS; L++)
        if (pattern <= 0 || (L + 1) % pattern != 0)
            cfg->layer_local[L / 8] |= (uint8_t)(1u << (L % 8));
}

/* ---- config.json ---------------------------------------------------------------------------*/

/* An integer field: 1 when present (stored in *out), 0 when absent or null, negative (error
 * set) when present with the wrong type. */
static int json_get_int(const json_t *o, const char *key, int *out, const char *label,
                        struct kwk_err *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    double d = json_is_number(v) ? json_number_value(v) : 0.5;
    /* the range first: converting a double outside it to an integer is undefined */
    if (!(d >= -2147483648.0 && d <= 2147483647.0) || d != (double)(int)d)
        return kwk_err_set(err, KWK_EFORMAT, "%s: \"%s\" must be an integer", label, key);
    *out = (int)d;
    return 1;
}

static int json_get_float(const json_t *o, const char *key, float *out, const char *label,
                          struct kwk_err *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    double d = json_number_value(v);
    if (!json_is_number(v) || !(fabs(d) <= FLT_MAX))
        return kwk_err_set(err, KWK_EFORMAT, "%s: \"%s\" must be a number (a float's range)",
                           label, key);
    *out = (float)d;
    return 1;
}

/* true/false; absent keeps *out. */
static int json_get_bool(const json_t *o, const char *key, int *out, const char *label,
                         struct kwk_err *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return kwk_err_set(err, KWK_EFORMAT, "%s: \"%s\" must be true or false", label, key);
    *out = json_is_true(v);
    return 1;
}

/* eos_token_id: an integer or a list of integers. Returns 1 when found. */
static int json_get_eos(const json_t *o, struct kwk_config *cfg, const char *label,
                        struct kwk_err *err)
{
    const json_t *v = json_object_get(o, "eos_token_id");
    if (!v || json_is_null(v))
        return 0;
    if (json_is_array(v)) {
        cfg->n_eos = 0;
        size_t i;
        const json_t *it;
        json_array_foreach(v, i, it) {
            if (!json_is_integer(it) || json_integer_value(it) < 0 ||
                json_integer_value(it) > INT32_MAX)
                return kwk_err_set(err, KWK_EFORMAT, "%s: eos_token_id[%zu] is not a token id",
                                   label, i);
            if (cfg->n_eos < (int)KWK_ARRAY_LEN(cfg->eos_ids))
                cfg->eos_ids[cfg->n_eos++] = (int)json_integer_value(it);
        }
        return 1;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return kwk_err_set(err, KWK_EFORMAT, "%s: eos_token_id is not a token id", label);
    cfg->n_eos = 1;
    cfg->eos_ids[0] = (int)json_integer_value(v);
    return 1;
}

static int json_rope_scaling(const json_t *o, struct kwk_config *cfg, const char *label,
                             struct kwk_err *err);

/* rope_scaling (transformers 4) or rope_parameters (transformers 5). */
static int json_rope(const json_t *root, struct kwk_config *cfg, const char *label,
                     struct kwk_err *err)
{
    int rc;
    const json_t *rp = json_object_get(root, "rope_parameters");
    const json_t *rs = json_object_get(root, "rope_scaling");
    if (json_is_object(rp) && (rc = json_get_float(rp, "rope_theta", &cfg->rope_theta, label,
                                                   err)) < 0)
        return rc;
    if ((rc = json_get_float(root, "rope_theta", &cfg->rope_theta, label, err)) < 0)
        return rc;
    const json_t *o = json_is_object(rs) ? rs : json_is_object(rp) ? rp : NULL;
    if (!o) {
        if (rs && !json_is_null(rs))
            return kwk_err_set(err, KWK_EFORMAT, "%s: rope_scaling must be an object or null",
                               label);
        return 0;
    }
    return json_rope_scaling(o, cfg, label, err);
}

/* The scaling an object of rope parameters names (rope_type or type, factor, ...). */
static int json_rope_scaling(const json_t *o, struct kwk_config *cfg, const char *label,
                             struct kwk_err *err)
{
    int rc;
    const json_t *t = json_object_get(o, "rope_type");
    if (!t)
        t = json_object_get(o, "type");
    const char *ts = json_is_string(t) ? json_string_value(t) : "default";
    if (!strcmp(ts, "default"))
        return 0;
    if (!strcmp(ts, "linear")) {
        cfg->rope_type = KWK_ROPE_LINEAR;
        rc = json_get_float(o, "factor", &cfg->rope_factor, label, err);
        return rc < 0 ? rc : 0;
    }
    if (!strcmp(ts, "llama3")) {
        cfg->rope_type = KWK_ROPE_LLAMA3;
        if (json_get_float(o, "factor", &cfg->rope_factor, label, err) < 0 ||
            json_get_float(o, "low_freq_factor", &cfg->rope_low_freq_factor, label, err) < 0 ||
            json_get_float(o, "high_freq_factor", &cfg->rope_high_freq_factor, label, err) < 0 ||
            json_get_int(o, "original_max_position_embeddings", &cfg->rope_orig_max_position,
                         label, err) < 0)
            return KWK_EFORMAT;
        if (!(cfg->rope_factor > 0.0f) || !(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor)
            || cfg->rope_orig_max_position <= 0)
            return kwk_err_set(err, KWK_EFORMAT, "%s: llama3 rope_scaling needs factor > 0, "
                               "high_freq_factor > low_freq_factor and "
                               "original_max_position_embeddings > 0", label);
        return 0;
    }
    cfg_unsupported(cfg, "rope scaling type \"%.40s\" is not supported (supported: default, "
                    "linear, llama3)", ts);
    return 0;
}

static void json_arch(const json_t *root, struct kwk_config *cfg)
{
    const json_t *a = json_object_get(root, "architectures");
    const char *name = NULL;
    if (json_is_array(a) && json_array_size(a) > 0 && json_is_string(json_array_get(a, 0)))
        name = json_string_value(json_array_get(a, 0));
    const json_t *mt = json_object_get(root, "model_type");
    /* BertForMaskedLM and the other heads hold the same encoder: it is what embeddings use;
     * RoBERTa and XLM-RoBERTa are BERT's layers with positions counted from pad_token_id + 1.
     * model_type decides (a RoBERTa config may still name BertModel among its architectures) */
    const char *family = json_is_string(mt) ? json_string_value(mt)
                         : name && !strncmp(name, "Bert", 4) ? "bert" : "";
    if (!strcmp(family, "bert") || !strcmp(family, "roberta") || !strcmp(family, "xlm-roberta")) {
        cfg->arch = KWK_ARCH_BERT;
        cfg->pos_offset = strcmp(family, "bert") ? -1 : 0; /* json_bert sets RoBERTa's */
        size_t nl = name ? strlen(name) : 0, ns = strlen("ForSequenceClassification");
        cfg->cls_head = nl > ns && !strcmp(name + nl - ns, "ForSequenceClassification");
        snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", name ? name : family);
        return;
    }
    for (size_t i = 0; i < KWK_ARRAY_LEN(archs); i++) {
        if ((name && !strcmp(name, archs[i].hf)) ||
            (!name && json_is_string(mt) && !strcmp(json_string_value(mt), archs[i].model_type))) {
            cfg->arch = archs[i].arch;
            snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", archs[i].hf);
            return;
        }
    }
    if (!name)
        name = json_is_string(mt) ? json_string_value(mt) : "(none given)";
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", name);
    if (!strcmp(name, "Gemma3ForConditionalGeneration"))
        cfg_unsupported(cfg, "architecture %.64s (text and images) is not supported: Kwker runs "
                        "Gemma 3's text decoder alone (Gemma3ForCausalLM)", name);
    cfg_unsupported(cfg, "architecture %.64s is not supported (supported: Llama, Mistral, Qwen2, "
                    "Qwen3, Gemma3ForCausalLM; encoders: BERT, RoBERTa, XLM-RoBERTa)", name);
}

/* The dimensions every architecture has; a config without them is not a model config. */
static int json_dims(const json_t *root, struct kwk_config *cfg, const char *label,
                     struct kwk_err *err)
{
    struct { const char *key; int *dst; } req[] = {
        {"vocab_size", &cfg->n_vocab},
        {"num_hidden_layers", &cfg->n_layers},
        {"hidden_size", &cfg->d_model},
        {"num_attention_heads", &cfg->n_heads},
        {"intermediate_size", &cfg->d_ff},
    };
    for (size_t i = 0; i < KWK_ARRAY_LEN(req); i++) {
        int rc = json_get_int(root, req[i].key, req[i].dst, label, err);
        if (rc < 0)
            return rc;
        if (rc == 0)
            return kwk_err_set(err, KWK_EFORMAT, "%s: \"%s\" is missing", label, req[i].key);
    }
    cfg->n_kv_heads = cfg->n_heads;
    cfg->head_dim = cfg->n_heads > 0 ? cfg->d_model / cfg->n_heads : 0;
    int rc, has_head_dim;
    if ((rc = json_get_int(root, "num_key_value_heads", &cfg->n_kv_heads, label, err)) < 0 ||
        (rc = has_head_dim = json_get_int(root, "head_dim", &cfg->head_dim, label, err)) < 0 ||
        (rc = json_get_int(root, "max_position_embeddings", &cfg->max_position, label, err)) < 0 ||
        (rc = json_get_float(root, "rms_norm_eps", &cfg->rms_eps, label, err)) < 0 ||
        (rc = json_get_bool(root, "tie_word_embeddings", &cfg->tie_embeddings, label, err)) < 0 ||
        (rc = json_get_eos(root, cfg, label, err)) < 0)
        return rc;
    /* bos only informs prompting: an odd value is ignored rather than refused */
    const json_t *bos = json_object_get(root, "bos_token_id");
    if (json_is_integer(bos) && json_integer_value(bos) >= 0 &&
        json_integer_value(bos) <= INT32_MAX)
        cfg->bos_id = (int)json_integer_value(bos);
    if (cfg->n_heads > 0 && !has_head_dim &&
        (int64_t)cfg->head_dim * cfg->n_heads != cfg->d_model)
        return kwk_err_set(err, KWK_EFORMAT, "%s: hidden_size %d is not a multiple of "
                           "num_attention_heads %d", label, cfg->d_model, cfg->n_heads);
    return 0;
}

/* Which layers of a Gemma 3 config are local: layer_types, else its sliding window pattern. */
static int json_gemma3_layers(const json_t *root, struct kwk_config *cfg, const char *label,
                              struct kwk_err *err)
{
    if (cfg->n_layers > KWK_MAX_LAYERS) /* cfg_validate says so; no bit past the map */
        return 0;
    const json_t *lt = json_object_get(root, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || json_array_size(lt) != (size_t)cfg->n_layers)
            return kwk_err_set(err, KWK_EFORMAT, "%s: layer_types must list num_hidden_layers "
                               "(%d) entries", label, cfg->n_layers);
        cfg_window_pattern(cfg, 1); /* every bit clear: all global until the list says */
        size_t i;
        const json_t *it;
        json_array_foreach(lt, i, it) {
            const char *v = json_is_string(it) ? json_string_value(it) : "";
            if (!strcmp(v, "sliding_attention"))
                cfg->layer_local[i / 8] |= (uint8_t)(1u << (i % 8));
            else if (strcmp(v, "full_attention"))
                return kwk_err_set(err, KWK_EFORMAT, "%s: layer_types[%zu] is neither "
                                   "\"sliding_attention\" nor \"full_attention\"", label, i);
        }
        return 0;
    }
    /* transformers' config keeps its pattern as _sliding_window_pattern, and takes a
     * sliding_window_pattern argument over it */
    int pattern = 6, rc;
    if ((rc = json_get_int(root, "_sliding_window_pattern", &pattern, label, err)) < 0 ||
        (rc = json_get_int(root, "sliding_window_pattern", &pattern, label, err)) < 0)
        return rc;
    if (pattern < 1)
        return kwk_err_set(err, KWK_EFORMAT, "%s: sliding_window_pattern must be positive",
                           label);
    cfg_window_pattern(cfg, pattern);
    return 0;
}

/* Gemma 3's rotary bases: transformers 5 keeps one set of parameters per layer type
 * (rope_parameters.full_attention / .sliding_attention), transformers 4 rope_theta and
 * rope_scaling for global layers and rope_local_base_freq for local ones. */
static int json_gemma3_rope(const json_t *root, struct kwk_config *cfg, const char *label,
                            struct kwk_err *err)
{
    cfg->rope_theta_local = 10000.0f;
    const json_t *rp = json_object_get(root, "rope_parameters");
    const json_t *full = json_is_object(rp) ? json_object_get(rp, "full_attention") : NULL;
    const json_t *slid = json_is_object(rp) ? json_object_get(rp, "sliding_attention") : NULL;
    int rc;
    if (json_is_object(full) || json_is_object(slid)) {
        if (json_is_object(full) &&
            ((rc = json_get_float(full, "rope_theta", &cfg->rope_theta, label, err)) < 0 ||
             (rc = json_rope_scaling(full, cfg, label, err)) < 0))
            return rc;
        if (json_is_object(slid)) {
            if ((rc = json_get_float(slid, "rope_theta", &cfg->rope_theta_local, label, err)) < 0)
                return rc;
            const json_t *t = json_object_get(slid, "rope_type");
            if (json_is_string(t) && strcmp(json_string_value(t), "default"))
                cfg_unsupported(cfg, "rope type \"%.40s\" on sliding layers is not supported",
                                json_string_value(t));
        }
    } else {
        if ((rc = json_rope(root, cfg, label, err)) < 0 ||
            (rc = json_get_float(root, "rope_local_base_freq", &cfg->rope_theta_local, label,
                                 err)) < 0)
            return rc;
    }
    if (!(cfg->rope_theta_local > 0.0f))
        return kwk_err_set(err, KWK_EFORMAT, "%s: the local rope base must be positive", label);
    return 0;
}

/* Gemma 3's text decoder (transformers' Gemma3TextConfig): GELU-tanh MLP, norms of 1 + w around
 * both blocks, q / k norms, scaled embeddings, local layers with a sliding window and their own
 * rotary base. */
static int json_gemma3(const json_t *root, struct kwk_config *cfg, const char *label,
                       struct kwk_err *err)
{
    const json_t *act = json_object_get(root, "hidden_activation");
    if (!act || json_is_null(act))
        act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) &&
        !(json_is_string(act) && !strcmp(json_string_value(act), "gelu_pytorch_tanh")))
        cfg_unsupported(cfg, "hidden_activation %.40s is not supported (only gelu_pytorch_tanh)",
                        json_is_string(act) ? json_string_value(act) : "(not a string)");
    cfg->act = KWK_ACT_GELU_TANH;
    cfg->qk_norm = 1;
    cfg->post_norms = 1;
    cfg->norm_plus_one = 1;
    cfg->embed_scale = (float)sqrt((double)cfg->d_model);
    int qpas = 256, bidir = 0, rc;
    if ((rc = json_get_int(root, "query_pre_attn_scalar", &qpas, label, err)) < 0 ||
        (rc = json_get_bool(root, "use_bidirectional_attention", &bidir, label, err)) < 0)
        return rc;
    if (qpas <= 0)
        return kwk_err_set(err, KWK_EFORMAT, "%s: query_pre_attn_scalar must be positive", label);
    cfg->attn_scale = (float)pow((double)qpas, -0.5);
    if (bidir)
        cfg_unsupported(cfg, "use_bidirectional_attention=true is not supported (a decoder)");
    static const char *const caps[] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (size_t i = 0; i < KWK_ARRAY_LEN(caps); i++) {
        const json_t *v = json_object_get(root, caps[i]);
        if (v && !json_is_null(v))
            cfg_unsupported(cfg, "%s is not supported", caps[i]);
    }
    cfg->sliding_window = 4096; /* Gemma3TextConfig's default */
    if ((rc = json_get_int(root, "sliding_window", &cfg->sliding_window, label, err)) < 0)
        return rc;
    if (cfg->sliding_window < 0)
        return kwk_err_set(err, KWK_EFORMAT, "%s: sliding_window is negative", label);
    if ((rc = json_gemma3_layers(root, cfg, label, err)) < 0)
        return rc;
    return json_gemma3_rope(root, cfg, label, err);
}

/* Options that change the computation in ways Kwker does not implement. */
static int json_options(const json_t *root, struct kwk_config *cfg, const char *label,
                        struct kwk_err *err)
{
    const json_t *act = json_object_get(root, "hidden_act");
    if (cfg->arch != KWK_ARCH_GEMMA3 && act &&
        !(json_is_string(act) && !strcmp(json_string_value(act), "silu")))
        cfg_unsupported(cfg, "hidden_act %.40s is not supported (only silu)",
                        json_is_string(act) ? json_string_value(act) : "(not a string)");
    int attn_bias = 0, mlp_bias = 0, use_sw = 0, rc;
    if ((rc = json_get_bool(root, "attention_bias", &attn_bias, label, err)) < 0 ||
        (rc = json_get_bool(root, "mlp_bias", &mlp_bias, label, err)) < 0 ||
        (rc = json_get_bool(root, "use_sliding_window", &use_sw, label, err)) < 0)
        return rc;
    if (attn_bias)
        cfg_unsupported(cfg, "attention_bias=true is not supported");
    if (mlp_bias)
        cfg_unsupported(cfg, "mlp_bias=true is not supported");
    if (cfg->arch == KWK_ARCH_QWEN2)
        cfg->qkv_bias = 1;
    if (cfg->arch == KWK_ARCH_QWEN3)
        cfg->qk_norm = 1;
    /* Qwen configs carry a sliding_window that only applies when use_sliding_window is set. */
    int is_qwen = cfg->arch == KWK_ARCH_QWEN2 || cfg->arch == KWK_ARCH_QWEN3;
    if (cfg->arch == KWK_ARCH_GEMMA3)
        return json_gemma3(root, cfg, label, err);
    if (!is_qwen || use_sw) {
        if ((rc = json_get_int(root, "sliding_window", &cfg->sliding_window, label, err)) < 0)
            return rc;
        if (cfg->sliding_window < 0)
            return kwk_err_set(err, KWK_EFORMAT, "%s: sliding_window is negative", label);
    }
    if (is_qwen && use_sw)
        cfg_unsupported(cfg, "use_sliding_window=true (per-layer windows) is not supported");
    return 0;
}

/* How sentence-transformers' CrossEncoder makes scores of a classifier's logits, as config.json
 * says it (sentence_transformers.activation_fn since version 4, sbert_ce_default_activation_
 * function before); config_sentence_transformers.json, which version 5 writes and which wins,
 * is read with the folder's other sentence-transformers files (st_pooling.c). */
static int json_score_act(const json_t *root, struct kwk_config *cfg, const char *label,
                          struct kwk_err *err)
{
    cfg->score_act = -1; /* the default, settled when the head's labels are known */
    const json_t *st = json_object_get(root, "sentence_transformers");
    const json_t *fn = json_is_object(st) ? json_object_get(st, "activation_fn") : NULL;
    if (!fn)
        fn = json_object_get(root, "sbert_ce_default_activation_function");
    if (!fn || json_is_null(fn))
        return 0;
    if (!json_is_string(fn))
        return kwk_err_set(err, KWK_EFORMAT, "%s: the cross-encoder's activation_fn is not a "
                           "string", label);
    kwk_score_act_set(cfg, json_string_value(fn));
    return 0;
}

/* A BERT encoder's options (BertConfig's names and defaults). */
static int json_bert(const json_t *root, struct kwk_config *cfg, const char *label,
                     struct kwk_err *err)
{
    int rc;
    cfg->encoder = 1;
    cfg->rms_eps = 1e-12f;
    cfg->n_types = 2;
    if ((rc = json_get_float(root, "layer_norm_eps", &cfg->rms_eps, label, err)) < 0 ||
        (rc = json_get_int(root, "type_vocab_size", &cfg->n_types, label, err)) < 0)
        return rc;
    if (cfg->n_types < 1 || cfg->n_types > 65536)
        return kwk_err_set(err, KWK_EFORMAT, "%s: type_vocab_size is %d (must be in 1..65536)",
                           label, cfg->n_types);
    if (cfg->pos_offset < 0) {
        /* RoBERTa's position ids: padding_idx + 1 + the token's place (no padding here) */
        int pad = 1;
        if ((rc = json_get_int(root, "pad_token_id", &pad, label, err)) < 0)
            return rc;
        if (pad < 0 || pad >= cfg->max_position - 1)
            return kwk_err_set(err, KWK_EFORMAT, "%s: pad_token_id %d leaves no positions of "
                               "max_position_embeddings %d", label, pad, cfg->max_position);
        cfg->pos_offset = pad + 1;
        cfg->max_position -= cfg->pos_offset;
    }
    if (cfg->max_position <= 0)
        return kwk_err_set(err, KWK_EFORMAT, "%s: max_position_embeddings must be positive",
                           label);
    const json_t *act = json_object_get(root, "hidden_act");
    const char *a = json_is_string(act) ? json_string_value(act) : act ? "(not a string)" : "gelu";
    if (!strcmp(a, "gelu"))
        cfg->act = KWK_ACT_GELU;
    else if (!strcmp(a, "gelu_new") || !strcmp(a, "gelu_pytorch_tanh"))
        cfg->act = KWK_ACT_GELU_TANH;
    else
        cfg_unsupported(cfg, "hidden_act %.40s is not supported for BERT (gelu, gelu_new, "
                        "gelu_pytorch_tanh)", a);
    const json_t *pe = json_object_get(root, "position_embedding_type");
    if (pe && !json_is_null(pe) &&
        !(json_is_string(pe) && !strcmp(json_string_value(pe), "absolute")))
        cfg_unsupported(cfg, "position_embedding_type %.40s is not supported (only absolute)",
                        json_is_string(pe) ? json_string_value(pe) : "(not a string)");
    int decoder = 0;
    if ((rc = json_get_bool(root, "is_decoder", &decoder, label, err)) < 0)
        return rc;
    if (decoder)
        cfg_unsupported(cfg, "is_decoder=true (a causal BERT) is not supported");
    return cfg->cls_head ? json_score_act(root, cfg, label, err) : 0;
}

static json_t *load_json(const char *path, struct kwk_err *err)
{
    char *text = NULL;
    size_t n = 0;
    if (kwk_read_file(path, CFG_JSON_MAX, &text, &n, err))
        return NULL;
    json_error_t jerr;
    json_t *root = json_loadb(text, n, 0, &jerr);
    kwk_free(text);
    if (!root) {
        kwk_err_set_pos(err, KWK_EFORMAT, jerr.position, "%s: invalid JSON at line %d column "
                        "%d: %s", path, jerr.line, jerr.column, jerr.text);
        if (err) {
            err->line = jerr.line;
            err->col = jerr.column;
        }
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        kwk_err_set(err, KWK_EFORMAT, "%s: not a JSON object", path);
        return NULL;
    }
    return root;
}

/* generation_config.json: its eos ids win over config.json's (that is what generate() uses). */
static int load_generation_config(struct kwk_config *cfg, const char *dir, struct kwk_err *err)
{
    char path[4096];
    if (kwk_path_join(path, sizeof path, dir, "generation_config.json"))
        return kwk_err_set(err, KWK_ELIMIT, "%s: path too long", dir);
    if (!kwk_file_exists(path))
        return 0;
    json_t *g = load_json(path, err);
    if (!g)
        return err ? err->code : KWK_EFORMAT;
    int rc = json_get_eos(g, cfg, path, err);
    const json_t *bos = json_object_get(g, "bos_token_id");
    if (cfg->bos_id < 0 && json_is_integer(bos) && json_integer_value(bos) >= 0 &&
        json_integer_value(bos) <= INT32_MAX)
        cfg->bos_id = (int)json_integer_value(bos);
    json_decref(g);
    return rc < 0 ? rc : 0;
}

int kwk_config_load_dir(struct kwk_config *cfg, const char *dir, struct kwk_err *err)
{
    char path[4096];
    cfg_defaults(cfg);
    if (kwk_path_join(path, sizeof path, dir, "config.json"))
        return kwk_err_set(err, KWK_ELIMIT, "%s: path too long", dir);
    if (!kwk_file_exists(path))
        return kwk_err_set(err, KWK_ENOTFOUND, "%s: no config.json (not a Hugging Face model "
                           "folder)", dir);
    json_t *root = load_json(path, err);
    if (!root)
        return err ? err->code : KWK_EFORMAT;
    int rc = 0;
    json_arch(root, cfg);
    /* an architecture we do not know has fields we do not know: the reason is the answer */
    if (cfg->arch == KWK_ARCH_UNKNOWN)
        goto out;
    if (cfg->arch == KWK_ARCH_BERT) {
        cfg->max_position = 512;
        if ((rc = json_dims(root, cfg, path, err)) < 0 ||
            (rc = json_bert(root, cfg, path, err)) < 0 ||
            (rc = kwk_st_pooling_load(cfg, dir, err)) < 0)
            goto out;
        kwk_seq_limit_load(cfg, dir);
        rc = cfg_validate(cfg, path, err);
        goto out;
    }
    /* transformers' defaults per architecture */
    cfg->max_position = cfg->arch == KWK_ARCH_LLAMA ? 2048 : 32768;
    if (cfg->arch == KWK_ARCH_GEMMA3) {
        cfg->max_position = 131072;
        cfg->tie_embeddings = 1; /* Gemma3TextConfig's default */
    }
    if ((rc = json_dims(root, cfg, path, err)) < 0 ||
        (cfg->arch != KWK_ARCH_GEMMA3 && (rc = json_rope(root, cfg, path, err)) < 0) ||
        (rc = json_options(root, cfg, path, err)) < 0)
        goto out;
    rc = load_generation_config(cfg, dir, err);
    if (rc)
        goto out;
    rc = cfg_validate(cfg, path, err);
out:
    json_decref(root);
    return rc;
}

/* ---- GGUF metadata -------------------------------------------------------------------------*/

/* The file's name for messages (a parsed buffer may have none). */
static const char *gpath(const struct kwk_gguf *g)
{
    return g->path ? g->path : "<gguf>";
}

/* An integer <arch>.<key>: 1 when present, 0 absent, negative on a bad value. */
static int gguf_int(const struct kwk_gguf *g, const char *arch, const char *key, int *out,
                    struct kwk_err *err)
{
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int64_t v;
    int rc = kwk_gguf_get_i64(g, k, &v);
    if (rc == KWK_ENOTFOUND)
        return 0;
    if (rc || v < INT32_MIN || v > INT32_MAX)
        return kwk_err_set(err, KWK_EFORMAT, "%s: %s must be an integer", gpath(g), k);
    *out = (int)v;
    return 1;
}

static int gguf_float(const struct kwk_gguf *g, const char *arch, const char *key, float *out,
                      struct kwk_err *err)
{
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    double v;
    int rc = kwk_gguf_get_f64(g, k, &v);
    if (rc == KWK_ENOTFOUND)
        return 0;
    if (rc || !(fabs(v) <= FLT_MAX))
        return kwk_err_set(err, KWK_EFORMAT, "%s: %s must be a number (a float's range)",
                           gpath(g), k);
    *out = (float)v;
    return 1;
}

static const struct kwk_tensor_ref *gguf_tensor(const struct kwk_gguf *g, const char *name)
{
    for (int i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->tensors[i].name, name))
            return &g->tensors[i];
    return NULL;
}

static int gguf_dims(struct kwk_config *cfg, const struct kwk_gguf *g, const char *a,
                     struct kwk_err *err)
{
    struct { const char *key; int *dst; } req[] = {
        {"block_count", &cfg->n_layers},
        {"embedding_length", &cfg->d_model},
        {"attention.head_count", &cfg->n_heads},
        {"feed_forward_length", &cfg->d_ff},
    };
    for (size_t i = 0; i < KWK_ARRAY_LEN(req); i++) {
        int rc = gguf_int(g, a, req[i].key, req[i].dst, err);
        if (rc < 0)
            return rc;
        if (rc == 0)
            return kwk_err_set(err, KWK_EFORMAT, "%s: %s.%s is missing", gpath(g), a, req[i].key);
    }
    cfg->n_kv_heads = cfg->n_heads;
    cfg->head_dim = cfg->n_heads > 0 ? cfg->d_model / cfg->n_heads : 0;
    int rc;
    if ((rc = gguf_int(g, a, "attention.head_count_kv", &cfg->n_kv_heads, err)) < 0 ||
        (rc = gguf_int(g, a, "attention.key_length", &cfg->head_dim, err)) < 0 ||
        (rc = gguf_int(g, a, "context_length", &cfg->max_position, err)) < 0 ||
        (rc = gguf_float(g, a, "attention.layer_norm_rms_epsilon", &cfg->rms_eps, err)) < 0 ||
        (rc = gguf_float(g, a, "rope.freq_base", &cfg->rope_theta, err)) < 0 ||
        (rc = gguf_int(g, a, "attention.sliding_window", &cfg->sliding_window, err)) < 0)
        return rc;
    int vlen = cfg->head_dim;
    if ((rc = gguf_int(g, a, "attention.value_length", &vlen, err)) < 0)
        return rc;
    if (vlen != cfg->head_dim)
        cfg_unsupported(cfg, "key_length %d differs from value_length %d", cfg->head_dim, vlen);
    return 0;
}

/* ---- Llama 3 rope scaling from llama.cpp's rope_freqs tensor ---------------------------------
 * llama.cpp does not store the llama3 parameters but their effect: one divisor per frequency,
 * 1 for short wavelengths w, `factor` for long ones, 1 / ((1 - s) / factor + s) between, with
 * s = (old / w - low) / (high - low). Scaling old, low and high together changes nothing, so with
 * low = 1 the blended divisors give old and high (two of them fix both; with fewer, any value
 * between the neighbouring wavelengths reproduces the same divisors). The parameters found are
 * checked by recomputing every divisor. */

static double l3_divisor(double w, double factor, double old, double lo, double hi)
{
    if (w < old / hi)
        return 1.0;
    if (w > old / lo)
        return factor;
    double s = (old / w - lo) / (hi - lo);
    return 1.0 / ((1.0 - s) / factor + s);
}

/* old and h = high - 1 (with low = 1) from the classified divisors; -1 when impossible. */
static int l3_solve(const double *w, const double *f, int n, double factor, double *old,
                    double *h)
{
    int first_s = -1, last_s = -1, last_one = -1, first_fac = -1;
    for (int i = 0; i < n; i++) {
        int one = fabs(f[i] - 1.0) <= 1e-6, fac = fabs(f[i] - factor) <= 1e-6 * factor;
        if (one && (first_s >= 0 || first_fac >= 0))
            return -1; /* divisors must go 1 ... blend ... factor as wavelengths grow */
        if (one)
            last_one = i;
        else if (fac && first_fac < 0)
            first_fac = i;
        else if (!fac && first_fac >= 0)
            return -1;
        else if (!fac) {
            if (first_s < 0)
                first_s = i;
            last_s = i;
        }
    }
    double sa, sb;
    if (first_s >= 0 && last_s > first_s) {
        sa = (1.0 / f[first_s] - 1.0 / factor) / (1.0 - 1.0 / factor);
        sb = (1.0 / f[last_s] - 1.0 / factor) / (1.0 - 1.0 / factor);
        double det = sa / w[last_s] - sb / w[first_s];
        if (det == 0.0)
            return -1;
        *old = (sa - sb) / det;
        *h = (1.0 / w[first_s] - 1.0 / w[last_s]) / det;
    } else if (first_s >= 0) {
        sa = (1.0 / f[first_s] - 1.0 / factor) / (1.0 - 1.0 / factor);
        *old = first_fac >= 0 ? sqrt(w[first_s] * w[first_fac]) : 2.0 * w[first_s];
        *h = (*old / w[first_s] - 1.0) / sa;
    } else {
        if (first_fac < 0)
            return -1;
        *old = last_one >= 0 ? sqrt(w[last_one] * w[first_fac]) : w[first_fac] / 2.0;
        double edge = last_one >= 0 ? sqrt(w[last_one] * *old) : *old / 2.0;
        *h = *old / edge - 1.0;
    }
    return *old > 0.0 && *h > 0.0 && isfinite(*old) && isfinite(*h) ? 0 : -1;
}

static int gguf_llama3_rope(struct kwk_config *cfg, const struct kwk_tensor_ref *t,
                            struct kwk_err *err)
{
    int n = cfg->head_dim / 2;
    if (n <= 0 || n > 32768 || t->n_dims != 1 || t->shape[0] != n) {
        cfg_unsupported(cfg, "rope_freqs.weight does not have head_dim/2 = %d values", n);
        return 0;
    }
    float *f32 = kwk_malloc(sizeof(float) * (size_t)n);
    double *f = kwk_malloc(sizeof(double) * (size_t)n), *w = kwk_malloc(sizeof(double) * (size_t)n);
    int rc = 0;
    if (!f32 || !f || !w) {
        rc = kwk_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    kwk_dequant_row(t->dtype, t->data, f32, n);
    double factor = 0.0;
    for (int i = 0; i < n; i++) {
        f[i] = f32[i];
        /* the wavelengths as transformers computes them: float32 inverse frequencies */
        float inv = 1.0f / powf(cfg->rope_theta, (float)(2 * i) / (float)cfg->head_dim);
        w[i] = 2.0 * 3.14159265358979323846 / (double)inv;
        factor = f[i] > factor ? f[i] : factor;
    }
    if (!(factor > 1.0 + 1e-6) || !isfinite(factor))
        goto out; /* all ones: no scaling */
    double old, h;
    if (l3_solve(w, f, n, factor, &old, &h)) {
        cfg_unsupported(cfg, "rope_freqs.weight is not Llama 3 rope scaling");
        goto out;
    }
    /* the original context is an integer: rescale old, low and high together */
    long n_old = old >= 1000.0 ? lround(old) : lround(old * 1000.0);
    double k = (double)n_old / old;
    if (n_old <= 0 || n_old > INT32_MAX) {
        cfg_unsupported(cfg, "rope_freqs.weight is not Llama 3 rope scaling");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        double d = l3_divisor(w[i], factor, (double)n_old, k, k * (1.0 + h));
        if (!(fabs(d - f[i]) <= 1e-4 * f[i])) { /* NaN fails too */
            cfg_unsupported(cfg, "rope_freqs.weight is not Llama 3 rope scaling (divisor %d)", i);
            goto out;
        }
    }
    cfg->rope_type = KWK_ROPE_LLAMA3;
    cfg->rope_factor = (float)factor;
    cfg->rope_low_freq_factor = (float)k;
    cfg->rope_high_freq_factor = (float)(k * (1.0 + h));
    cfg->rope_orig_max_position = (int)n_old;
out:
    kwk_free(f32);
    kwk_free(f);
    kwk_free(w);
    return rc;
}

static int gguf_rope(struct kwk_config *cfg, const struct kwk_gguf *g, const char *a,
                     struct kwk_err *err)
{
    char k[160];
    const char *s;
    size_t n;
    snprintf(k, sizeof k, "%s.rope.scaling.type", a);
    if (kwk_gguf_get_str(g, k, &s, &n) == 0) {
        if (n == 6 && !memcmp(s, "linear", 6)) {
            cfg->rope_type = KWK_ROPE_LINEAR;
            int rc = gguf_float(g, a, "rope.scaling.factor", &cfg->rope_factor, err);
            if (rc < 0)
                return rc;
        } else if (!(n == 4 && !memcmp(s, "none", 4))) {
            cfg_unsupported(cfg, "rope scaling type \"%.*s\" is not supported", (int)KWK_MIN(n, 40),
                            s);
        }
    }
    const struct kwk_tensor_ref *t = gguf_tensor(g, "rope_freqs.weight");
    return t ? gguf_llama3_rope(cfg, t, err) : 0;
}

static int gguf_token_ids(struct kwk_config *cfg, const struct kwk_gguf *g)
{
    int64_t v;
    if (kwk_gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &v) == 0 && v >= 0 && v <= INT32_MAX)
        cfg->bos_id = (int)v;
    static const char *const eos_keys[] = {"tokenizer.ggml.eos_token_id",
                                           "tokenizer.ggml.eot_token_id",
                                           "tokenizer.ggml.eom_token_id"};
    for (size_t i = 0; i < KWK_ARRAY_LEN(eos_keys); i++) {
        if (kwk_gguf_get_i64(g, eos_keys[i], &v) || v < 0 || v > INT32_MAX)
            continue;
        int dup = 0;
        for (int j = 0; j < cfg->n_eos; j++)
            dup |= cfg->eos_ids[j] == (int)v;
        if (!dup && cfg->n_eos < (int)KWK_ARRAY_LEN(cfg->eos_ids))
            cfg->eos_ids[cfg->n_eos++] = (int)v;
    }
    return 0;
}

static void gguf_vocab(struct kwk_config *cfg, const struct kwk_gguf *g, const char *a)
{
    const struct kwk_tensor_ref *t = gguf_tensor(g, "token_embd.weight");
    if (t && t->n_dims == 2 && t->shape[0] <= INT32_MAX) {
        cfg->n_vocab = (int)t->shape[0];
        return;
    }
    const struct kwk_gguf_kv *kv = kwk_gguf_find(g, "tokenizer.ggml.tokens");
    if (kv && kv->type == KWK_GGUF_ARRAY && kv->arr_len <= INT32_MAX) {
        cfg->n_vocab = (int)kv->arr_len;
        return;
    }
    gguf_int(g, a, "vocab_size", &cfg->n_vocab, NULL);
}

/* Gemma 3 as llama.cpp runs it: its converter added the 1 to every norm weight; every sixth
 * layer is global; local layers rotate with base 10000 (or <arch>.rope.freq_base_swa) and no
 * scaling; the softmax scale is 1/sqrt(key_length), but 1/sqrt(d_model / heads) for the 27B
 * model (62 layers), whose query_pre_attn_scalar is that. The file keeps neither. */
static int gguf_gemma3(struct kwk_config *cfg, const struct kwk_gguf *g, const char *a,
                       struct kwk_err *err)
{
    cfg->act = KWK_ACT_GELU_TANH;
    cfg->qk_norm = 1;
    cfg->post_norms = 1;
    cfg->norm_plus_one = 0;
    cfg->embed_scale = sqrtf((float)cfg->d_model);
    cfg->rope_theta_local = 10000.0f;
    int rc = gguf_float(g, a, "rope.freq_base_swa", &cfg->rope_theta_local, err);
    if (rc < 0)
        return rc;
    if (!(cfg->rope_theta_local > 0.0f))
        return kwk_err_set(err, KWK_EFORMAT, "%s: %s.rope.freq_base_swa must be positive",
                           gpath(g), a);
    int qk = cfg->n_layers == 62 && cfg->n_heads > 0 ? cfg->d_model / cfg->n_heads : cfg->head_dim;
    cfg->attn_scale = qk > 0 ? 1.0f / sqrtf((float)qk) : 0.0f;
    cfg_window_pattern(cfg, 6);
    return 0;
}

/* A BERT encoder as llama.cpp's converter writes it: LayerNorm epsilon, pooling type, the type
 * table's rows; its GELU is BERT's erf one (llama.cpp computes the tanh form). Embeddings are
 * normalized, as llama.cpp's server does by default. */
static int gguf_bert(struct kwk_config *cfg, const struct kwk_gguf *g, const char *a,
                     struct kwk_err *err)
{
    cfg->encoder = 1;
    cfg->act = KWK_ACT_GELU;
    cfg->rms_eps = 1e-12f;
    cfg->normalize = 1;
    int rc, pooling = KWK_POOLING_CLS, causal = 0;
    if ((rc = gguf_dims(cfg, g, a, err)) < 0 ||
        (rc = gguf_float(g, a, "attention.layer_norm_epsilon", &cfg->rms_eps, err)) < 0 ||
        (rc = gguf_int(g, a, "pooling_type", &pooling, err)) < 0)
        return rc;
    if (pooling == 4) {
        /* llama.cpp's RANK: a reranker's head (cls, cls.output) on the first token */
        cfg->cls_head = 1;
        cfg->score_act = -1;
        pooling = KWK_POOLING_CLS;
    }
    if (pooling < KWK_POOLING_MEAN || pooling > KWK_POOLING_LAST)
        cfg_unsupported(cfg, "%s.pooling_type %d is not supported (1 mean, 2 cls, 3 last, "
                        "4 rank)", a, pooling);
    cfg->pooling = pooling;
    char k[160];
    snprintf(k, sizeof k, "%s.attention.causal", a);
    if (kwk_gguf_get_bool(g, k, &causal) == 0 && causal)
        cfg_unsupported(cfg, "%s is causal: not an encoder Kwker runs", k);
    if (cfg->max_position <= 0)
        return kwk_err_set(err, KWK_EFORMAT, "%s: %s.context_length must be positive", gpath(g),
                           a);
    cfg->max_tokens = cfg->max_position; /* no tokenizer limit in the file: llama.cpp's too */
    const struct kwk_tensor_ref *t = gguf_tensor(g, "token_types.weight");
    cfg->n_types = t && t->n_dims == 2 && t->shape[0] > 0 && t->shape[0] <= 65536
                       ? (int)t->shape[0] : 1;
    gguf_vocab(cfg, g, a);
    return cfg_validate(cfg, gpath(g), err);
}

int kwk_config_from_gguf(struct kwk_config *cfg, const struct kwk_gguf *g, struct kwk_err *err)
{
    cfg_defaults(cfg);
    const char *s;
    size_t n;
    if (kwk_gguf_get_str(g, "general.architecture", &s, &n))
        return kwk_err_set(err, KWK_EFORMAT, "%s: general.architecture is missing", gpath(g));
    char a[64];
    snprintf(a, sizeof a, "%.*s", (int)KWK_MIN(n, sizeof a - 1), s);
    for (char *p = a; *p; p++)
        if ((unsigned char)*p < 0x20)
            *p = '?';
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", a);
    if (!strcmp(a, "llama"))
        cfg->arch = KWK_ARCH_LLAMA;
    else if (!strcmp(a, "qwen2"))
        cfg->arch = KWK_ARCH_QWEN2, cfg->qkv_bias = 1;
    else if (!strcmp(a, "qwen3"))
        cfg->arch = KWK_ARCH_QWEN3, cfg->qk_norm = 1;
    else if (!strcmp(a, "gemma3"))
        cfg->arch = KWK_ARCH_GEMMA3;
    else if (!strcmp(a, "bert"))
        cfg->arch = KWK_ARCH_BERT;
    else {
        cfg_unsupported(cfg, "GGUF architecture %s is not supported (supported: llama, qwen2, "
                        "qwen3, gemma3, bert)", a);
        return 0;
    }
    int rc;
    if (cfg->arch == KWK_ARCH_BERT)
        return gguf_bert(cfg, g, a, err);
    if ((rc = gguf_dims(cfg, g, a, err)) < 0 || (rc = gguf_rope(cfg, g, a, err)) < 0)
        return rc;
    if (cfg->arch == KWK_ARCH_GEMMA3 && (rc = gguf_gemma3(cfg, g, a, err)) < 0)
        return rc;
    gguf_token_ids(cfg, g);
    gguf_vocab(cfg, g, a);
    cfg->tie_embeddings = gguf_tensor(g, "output.weight") == NULL;
    if (cfg->sliding_window < 0)
        cfg->sliding_window = 0;
    return cfg_validate(cfg, gpath(g), err);
}
