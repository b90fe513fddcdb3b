/* model.h - checkpoints in memory: configuration, the tensors of a file, and the assembled model.
 * Loading runs on the caller's thread; a loaded model is shared read-only across threads, but
 * for the float copies it makes on demand (under its lock; see kwk_model_floats_acquire). */
#ifndef KWK_MODEL_H
#define KWK_MODEL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "kernels/kernels.h"

/* Tensor element types found in files. Internal (not in any file of ours): order is free. */
enum kwk_dtype {
    KWK_DT_F32 = 0,
    KWK_DT_F16,
    KWK_DT_BF16,
    KWK_DT_Q8_0,
    KWK_DT_Q4_0,
    KWK_DT_Q4_1,
    KWK_DT_Q5_0,
    KWK_DT_Q5_1,
    KWK_DT_Q4_K,
    KWK_DT_Q5_K,
    KWK_DT_Q6_K,
    KWK_DT_COUNT
};

const char *kwk_dtype_name(int dtype);
/* Elements per block and bytes per block (1 and the element size for plain types). */
int kwk_dtype_block(int dtype);
size_t kwk_dtype_block_bytes(int dtype);
/* Bits of one weight's code, its block's scales and offsets aside: 4 for Q4_0 / Q4_1 / Q4_K, 5 for
 * the Q5s, 6 for Q6_K, 8 for Q8_0, 16 or 32 for the plain types; 0 for an unknown type. */
int kwk_dtype_bits(int dtype);
/* Bytes for a row of n elements; KWK_EFORMAT-worthy when n is not a multiple of the block:
 * returns 0 then. */
size_t kwk_dtype_row_bytes(int dtype, int64_t n);

/* Dequantize (or widen) n elements of a row to float32. n must be a multiple of the block. */
void kwk_dequant_row(int dtype, const void *src, float *dst, int64_t n);

#define KWK_MAX_DIMS 4

/* A tensor inside a mapped file. shape is outermost first, as PyTorch / safetensors write it
 * (a GGUF tensor with ne = {cols, rows} has shape {rows, cols}). data is borrowed. */
struct kwk_tensor_ref {
    const char *name;     /* NUL-terminated, owned by the file object */
    int dtype;            /* enum kwk_dtype */
    int n_dims;
    int64_t shape[KWK_MAX_DIMS];
    const uint8_t *data;
    size_t nbytes;
};

/* ---- safetensors ---------------------------------------------------------------------------*/

struct kwk_st_file {
    char *path;
    struct kwk_map map;
    int n_tensors;
    struct kwk_tensor_ref *tensors; /* file order */
    char *names;                    /* storage for tensor names */
    /* Tensors of a type Kwker does not run (integers, float64, float8: e.g. BERT's I64
     * position_ids buffer): only named, so that a model needing one can say why. */
    int n_unrun;
    const char **unrun;             /* [n_unrun] into names */
};

/* Map and validate one .safetensors file: header length within the file, JSON header well
 * formed, dtypes known (F32/F16/BF16 as tensors; the other safetensors types only named, in
 * unrun), shapes consistent with offsets, offsets inside the data and not overlapping. Errors
 * name the file. */
int kwk_st_open(struct kwk_st_file *f, const char *path, struct kwk_err *err);
/* Parse from memory (fuzzing and tests); label names the source in errors. Tensor data points
 * into buf. */
int kwk_st_parse(struct kwk_st_file *f, const uint8_t *buf, size_t size, const char *label,
                 struct kwk_err *err);
void kwk_st_close(struct kwk_st_file *f);

/* ---- GGUF ----------------------------------------------------------------------------------*/

enum kwk_gguf_type {
    KWK_GGUF_UINT8 = 0, KWK_GGUF_INT8 = 1, KWK_GGUF_UINT16 = 2, KWK_GGUF_INT16 = 3,
    KWK_GGUF_UINT32 = 4, KWK_GGUF_INT32 = 5, KWK_GGUF_FLOAT32 = 6, KWK_GGUF_BOOL = 7,
    KWK_GGUF_STRING = 8, KWK_GGUF_ARRAY = 9, KWK_GGUF_UINT64 = 10, KWK_GGUF_INT64 = 11,
    KWK_GGUF_FLOAT64 = 12,
};

/* One metadata entry. For arrays, arr_type/arr_len describe the items and val points at the
 * first item's bytes in the file (strings are length-prefixed, so use kwk_gguf_arr_strings). */
struct kwk_gguf_kv {
    const char *key; /* NUL-terminated copy */
    int type;        /* enum kwk_gguf_type */
    int arr_type;
    uint64_t arr_len;
    const uint8_t *val;
    size_t val_bytes; /* bytes of the whole value in the file */
};

struct kwk_gguf {
    char *path;
    struct kwk_map map;
    uint32_t version;
    int64_t n_kv;
    struct kwk_gguf_kv *kv;
    int n_tensors;
    struct kwk_tensor_ref *tensors;
    char *strings; /* storage for keys and names */
    size_t alignment;
};

/* Map and validate a GGUF v2/v3 file: magic, version, counts bounded by the file size, every
 * string and array inside the file, tensor types known, tensor data inside the data section and
 * not overlapping. Errors name the file and the problem. */
int kwk_gguf_open(struct kwk_gguf *g, const char *path, struct kwk_err *err);
int kwk_gguf_parse(struct kwk_gguf *g, const uint8_t *buf, size_t size, const char *label,
                   struct kwk_err *err);
void kwk_gguf_close(struct kwk_gguf *g);

const struct kwk_gguf_kv *kwk_gguf_find(const struct kwk_gguf *g, const char *key);
/* Typed getters: 0 on success, KWK_ENOTFOUND when absent, KWK_EFORMAT on a type mismatch
 * (integer types convert among themselves when the value fits). */
int kwk_gguf_get_i64(const struct kwk_gguf *g, const char *key, int64_t *out);
int kwk_gguf_get_f64(const struct kwk_gguf *g, const char *key, double *out);
int kwk_gguf_get_bool(const struct kwk_gguf *g, const char *key, int *out);
/* The string is not NUL-terminated in the file: pointer and length. */
int kwk_gguf_get_str(const struct kwk_gguf *g, const char *key, const char **s, size_t *n);
/* Fill ptrs[i], lens[i] for every string of an array of strings (arrays of kv->arr_len). */
int kwk_gguf_arr_strings(const struct kwk_gguf_kv *kv, const char **ptrs, size_t *lens);
/* Read item i of a numeric array as int64 / double. */
int kwk_gguf_arr_i64(const struct kwk_gguf_kv *kv, uint64_t i, int64_t *out);
int kwk_gguf_arr_f64(const struct kwk_gguf_kv *kv, uint64_t i, double *out);

/* ---- configuration -------------------------------------------------------------------------*/

enum kwk_rope_type { KWK_ROPE_DEFAULT = 0, KWK_ROPE_LLAMA3 = 1, KWK_ROPE_LINEAR = 2 };
/* The MLP's activation: SiLU (Llama, Qwen) or the tanh approximation of GELU (Gemma) on a
 * gate; GELU itself (erf: BERT's "gelu") or its tanh form on an encoder's one product. */
enum kwk_act { KWK_ACT_SILU = 0, KWK_ACT_GELU_TANH = 1, KWK_ACT_GELU = 2 };

/* Layers a config can describe: layer_local holds one bit each. */
#define KWK_MAX_LAYERS 4096

struct kwk_config {
    int arch;               /* enum kwk_arch */
    char arch_name[64];
    int n_vocab, n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, max_position;
    float rms_eps;          /* the norms' epsilon: RMS norms', an encoder's LayerNorms' */
    float rope_theta;
    int rope_type;          /* enum kwk_rope_type */
    float rope_factor;      /* llama3 / linear */
    float rope_low_freq_factor, rope_high_freq_factor;
    int rope_orig_max_position;
    int sliding_window;     /* 0 = none */
    /* 0: sliding_window applies to every layer (Mistral). 1: only to the layers whose bit is set
     * in layer_local (Gemma 3's local layers; the others attend to everything). */
    int window_per_layer;
    uint8_t layer_local[KWK_MAX_LAYERS / 8];
    float rope_theta_local; /* > 0: local layers' rotary base, no scaling (Gemma 3) */
    int act;                /* enum kwk_act */
    float embed_scale;      /* embeddings are multiplied by this (Gemma: sqrt(d_model)), else 1 */
    float attn_scale;       /* softmax(q.k * attn_scale): 1/sqrt(head_dim), or Gemma's
                               query_pre_attn_scalar^-1/2 */
    int post_norms;         /* Gemma 3: RMS norms on the attention's and the MLP's outputs, before
                               each residual add */
    int norm_plus_one;      /* Gemma's checkpoints store norm weights w for x * (1 + w); the
                               loader adds the 1 (GGUF files have it added already) */
    int tie_embeddings;
    int qkv_bias;           /* Qwen2 */
    int qk_norm;            /* Qwen3 */
    int bos_id;             /* -1 unknown */
    int n_eos;
    int eos_ids[8];
    /* Encoders (BERT): post-norm LayerNorms with biases, absolute positions, a token type
     * table, bidirectional attention; their states pooled into one embedding. */
    int encoder;            /* 1: an encoder (kwk_encoder), not a decoder */
    int n_types;            /* token type vocabulary (type_vocab_size) */
    int pos_offset;         /* the position table's row of a sequence's first token: 0, or
                               RoBERTa's pad_token_id + 1 (max_position counts the rows after) */
    int pooling;            /* enum kwk_pooling: the model's own (sentence-transformers, GGUF) */
    int normalize;          /* 1: its embeddings are L2-normalized */
    /* A sequence-classification head (a cross-encoder) on the first token's state. */
    int cls_head;           /* 1: the checkpoint has one (*ForSequenceClassification, GGUF's
                               pooling_type 4, llama.cpp's RANK) */
    int n_labels;           /* its outputs, from its tensor (0 without a head) */
    int score_act;          /* enum kwk_score_act: sentence-transformers' CrossEncoder's */
    char score_act_bad[96]; /* an activation_fn config.json names that Kwker does not run: the
                               model is unsupported unless config_sentence_transformers.json,
                               read after it, names one it does */
    /* The longest sequence an encoder's users truncate at (seq_limit.c): sentence-transformers'
     * max_seq_length (sentence_bert_config.json of a folder with modules.json) and the
     * tokenizer's model_max_length (tokenizer_config.json), each 0 when absent or not a
     * positive whole number, INT32_MAX above it (transformers' 1e30: no limit); max_tokens
     * the one that applies, never above max_position (GGUF: max_position). Decoders: 0. */
    int st_max_seq_length;
    int tok_max_length;
    int max_tokens;
    char unsupported[256];  /* non-empty: why this model cannot run */
};

/* The longest sequence an encoder takes: cfg->max_tokens, or the positions for a config that
 * was not read from files (max_tokens 0). */
static inline int kwk_config_max_tokens(const struct kwk_config *cfg)
{
    return cfg->max_tokens > 0 && cfg->max_tokens < cfg->max_position ? cfg->max_tokens
                                                                       : cfg->max_position;
}

/* Whether layer L attends through a sliding window (of cfg->sliding_window positions). */
static inline int kwk_config_layer_windowed(const struct kwk_config *cfg, int L)
{
    if (cfg->sliding_window <= 0)
        return 0;
    return !cfg->window_per_layer || (cfg->layer_local[L / 8] >> (L % 8) & 1);
}

/* Whether layer L rotates with the local base (rope_theta_local) rather than rope_theta. */
static inline int kwk_config_layer_local_rope(const struct kwk_config *cfg, int L)
{
    return cfg->rope_theta_local > 0.0f && cfg->window_per_layer &&
           (cfg->layer_local[L / 8] >> (L % 8) & 1);
}

/* Read config.json (and generation_config.json beside it, for eos ids) of a model folder. A
 * model Kwker cannot run is not an error here: cfg->unsupported says why. */
int kwk_config_load_dir(struct kwk_config *cfg, const char *dir, struct kwk_err *err);
/* An encoder folder's pooling and normalization (cfg->pooling, normalize) from its
 * sentence-transformers files (modules.json, the Pooling module's config.json); without them the
 * first token's state, normalized. A module Kwker does not run sets cfg->unsupported. */
int kwk_st_pooling_load(struct kwk_config *cfg, const char *dir, struct kwk_err *err);
/* The JSON object of file name in dir (at most max_bytes; jansson's decoding flags), or NULL:
 * *rc 0 when the file is absent, else negative with err set (unreadable, malformed, not an
 * object). The caller owns the object (json_decref). */
struct json_t;
struct json_t *kwk_json_read_object(const char *dir, const char *name, size_t max_bytes,
                                    size_t flags, int *rc, struct kwk_err *err);
/* An encoder folder's sequence limit (cfg->st_max_seq_length, tok_max_length, max_tokens) as
 * sentence-transformers and its CrossEncoder take it: max_seq_length when the folder is a
 * sentence-transformers one (modules.json) and gives it, else model_max_length, at most
 * cfg->max_position (which must be set). A file or value that cannot be read is ignored, with a
 * warning: the positions are the limit then. Never fails. */
void kwk_seq_limit_load(struct kwk_config *cfg, const char *dir);
/* A cross-encoder's activation_fn as sentence-transformers names it (a class path):
 * cfg->score_act Sigmoid or Identity; a path outside torch stays the default, as
 * sentence-transformers does without trust_remote_code; another torch class is kept in
 * cfg->score_act_bad (kwk_st_pooling_load then makes the model unsupported). */
void kwk_score_act_set(struct kwk_config *cfg, const char *path);
/* The same from GGUF metadata (general.architecture, <arch>.*). */
int kwk_config_from_gguf(struct kwk_config *cfg, const struct kwk_gguf *g, struct kwk_err *err);

/* ---- the assembled model -------------------------------------------------------------------*/

struct kwk_layer {
    float *attn_norm;              /* [d_model] */
    struct kwk_mat wq;             /* [n_heads*head_dim][d_model] */
    struct kwk_mat wk, wv;         /* [n_kv_heads*head_dim][d_model] */
    struct kwk_mat wo;             /* [d_model][n_heads*head_dim] */
    float *bq, *bk, *bv;           /* [n_heads*head_dim], [n_kv*head_dim] x2; NULL without bias */
    float *q_norm, *k_norm;        /* [head_dim]; NULL without qk norm */
    float *ffn_norm;               /* [d_model] */
    float *post_attn_norm;         /* [d_model] on the o-product's output; NULL without */
    float *post_ffn_norm;          /* [d_model] on the down product's output; NULL without */
    struct kwk_mat w_gate, w_up;   /* [d_ff][d_model] */
    struct kwk_mat w_down;         /* [d_model][d_ff] */
};

/* An encoder layer (BERT, post-norm): x = LN(x + attn(x) wo + bo), x = LN(x + act(x w_up + b_up)
 * w_down + b_down). Every matrix has its bias; every LayerNorm its weight and bias. */
struct kwk_enc_layer {
    struct kwk_mat wq, wk, wv, wo;  /* [d_model][d_model] */
    float *bq, *bk, *bv, *bo;       /* [d_model] */
    float *attn_ln, *attn_ln_b;     /* [d_model] after attention's residual add */
    struct kwk_mat w_up;            /* [d_ff][d_model] */
    struct kwk_mat w_down;          /* [d_model][d_ff] */
    float *b_up, *b_down;           /* [d_ff], [d_model] */
    float *ffn_ln, *ffn_ln_b;       /* [d_model] after the MLP's residual add */
};

/* Drop the resident pages of the model's file mappings (safetensors shards, GGUF): after its
 * matrices were repacked they are read only for a few embedding rows a token, which fault back
 * in. Changes memory use, never results. */
void kwk_model_release_pages(const struct kwk_model *m);

/* A matrix the file does not hold as the kernels read it (a quantized GGUF tensor, float32;
 * q/k rows that llama.cpp permuted, or misaligned plain data, in the tensor's own type): made
 * from the mapped tensor only while a user holds it (kwk_model_floats_acquire), so that a packed
 * decoder's process does not keep an expansion of the whole checkpoint beside its pack. */
struct kwk_lazy_mat {
    struct kwk_mat *mat;               /* the model's matrix (data NULL when cold) */
    struct kwk_mat *alias;             /* the tied lm_head sharing it, or NULL */
    const struct kwk_tensor_ref *t;    /* what it is made from */
    int n_head;                        /* > 0: undo llama.cpp's q/k row permutation */
    void *copy;                        /* [rows][cols] of mat->wtype while acquired, else NULL */
};

/* The file's type of a matrix the loader copied (quantized, or permuted / misaligned plain). */
struct kwk_mat_src {
    const struct kwk_mat *mat;         /* the model's matrix */
    int dtype;                         /* enum kwk_dtype of the tensor it is made from */
    const struct kwk_tensor_ref *t;    /* that tensor */
    int n_head;                        /* > 0: its rows are llama.cpp's permuted q / k rows */
};

struct kwk_model {
    struct kwk_config cfg;
    char *path;                    /* what was loaded: folder or .gguf */
    struct kwk_mat tok_emb;        /* [n_vocab][d_model] */
    struct kwk_mat lm_head;        /* [n_vocab][d_model]; == tok_emb when tied */
    float *out_norm;               /* [d_model] */
    struct kwk_layer *layers;      /* [n_layers] decoders */
    /* Encoders (cfg.encoder): tok_emb is the word table; layers is NULL, out_norm unused. */
    struct kwk_enc_layer *enc_layers; /* [n_layers] */
    float *pos_emb;                /* [max_position][d_model], from a first token's row */
    float *type_emb;               /* [n_types][d_model] */
    float *emb_ln, *emb_ln_b;      /* [d_model] the embeddings' LayerNorm */
    /* The classification head (cfg.cls_head): y = out_w tanh(dense_w x + dense_b) + out_b on
     * the first token's state x; dense absent (NULL) in a GGUF without cls.weight. */
    float *head_dense_w, *head_dense_b; /* [d_model][d_model], [d_model] */
    float *head_out_w, *head_out_b;     /* [n_labels][d_model], [n_labels] (bias may be NULL) */
    /* what backs the weights */
    int n_st;
    struct kwk_st_file *st;        /* [n_st] safetensors shards */
    struct kwk_gguf *gguf;         /* or one GGUF file */
    void **owned;                  /* buffers made at load (norms, dequantized tensors) */
    int n_owned, cap_owned;
    int64_t n_params;
    /* Lazy float matrices. Their data pointers (and copy) are the one mutable part of a loaded
     * model: written only under lazy_lock, by the acquire / release pair below. */
    struct kwk_lazy_mat *lazy;     /* [n_lazy] */
    int n_lazy;
    int lazy_refs;                 /* holders of kwk_model_floats_acquire */
    struct kwk_mat_src *srcs;      /* [n_srcs] every copied matrix, fixed after load */
    int n_srcs;
    pthread_mutex_t lazy_lock;
    int huge_done; /* kwk_model_huge_pages ran (under lazy_lock) */
    /* Where kwk_model_embed_row reads tok_emb's rows from (emb_file 1): pread from the file,
     * not through the mapping, whose page faults would also map the pages around each row. */
    int emb_file;
    int emb_fd;
    int emb_dtype;                 /* enum kwk_dtype of the table in the file */
    int64_t emb_off;               /* the table's offset in the file */
    size_t emb_row_bytes;
};

/* Whether kwk_model_load makes float32 copies on demand (1) or at load (0). On demand needs
 * every reader of the model's float matrices to hold them (kwk_model_floats_acquire: the
 * preserve decoder, calibration) and the embedding lookups to go through kwk_model_embed_row. */
#ifndef KWK_MODEL_LAZY_DEFAULT
#define KWK_MODEL_LAZY_DEFAULT 1
#endif

/* kwk_model_load, choosing whether float32 copies of tensors are made at load (lazy = 0: every
 * matrix's data is valid at once) or on demand (lazy = 1: see struct kwk_lazy_mat). The floats
 * are bitwise the same either way. kwk_model_load uses KWK_MODEL_LAZY_DEFAULT. */
struct kwk_model *kwk_model_load_ex(const char *path_or_id, int lazy, struct kwk_err *err);

/* Make every lazy matrix's float32 data valid (m->layers[..], tok_emb, lm_head), for a user
 * that reads the model's float matrices directly (a preserve decoder, calibration). Counted:
 * each successful call needs one kwk_model_floats_release. A no-op on an eager model.
 * Thread-safe. */
int kwk_model_floats_acquire(const struct kwk_model *m, struct kwk_err *err);
/* Drop one hold; the last one frees the copies (their data pointers become NULL again). */
void kwk_model_floats_release(const struct kwk_model *m);

/* Put the checkpoint's files on 2 MiB pages (kwk_map_huge) for a user that reads its matrices
 * in place on every token (a preserve decoder); once per model, later calls return at once. A
 * model with lazy float32 expansions (a quantized GGUF) runs from them and is left alone.
 * Advice: nothing the model holds changes. Thread-safe. */
void kwk_model_huge_pages(const struct kwk_model *m);

/* One float32 matrix for a short read (packing it): *out is w itself when w's data is the
 * model's for good (mapped or made at load), else a private copy made now. Pair with
 * kwk_model_mat_release, which frees the copy and drops the resident pages of the file bytes
 * it came from (a residency change only: they fault back in when read). Thread-safe. */
int kwk_model_mat_acquire(const struct kwk_model *m, const struct kwk_mat *w, struct kwk_mat *out,
                          struct kwk_err *err);
void kwk_model_mat_release(const struct kwk_model *m, const struct kwk_mat *w,
                           struct kwk_mat *out);

/* The enum kwk_dtype of the file tensor w (one of m's matrices: layers[..], tok_emb, lm_head) is
 * made from, e.g. KWK_DT_Q4_K for a matrix dequantized from a K-quant GGUF; the type of w's own
 * data for a matrix the loader did not make (mapped in place, or an in-memory model's); -1 when
 * that is no file type. Thread-safe (the table is fixed after load). */
int kwk_model_mat_dtype(const struct kwk_model *m, const struct kwk_mat *w);

/* The file tensor a copied matrix w was made from (a quantized GGUF tensor, or permuted /
 * misaligned plain rows), or NULL; *n_head > 0 when its rows are llama.cpp's permuted q / k
 * rows: row r of w is then the tensor's row kwk_model_file_row(r, w->rows, *n_head). For a
 * packer that reads a file's own quantization grid rather than its dequantized floats.
 * Thread-safe. */
/* Drop the resident pages of bytes [p, p + n) of one of m's files (a residency change: they
 * fault back in when read), as kwk_model_mat_release does for the tensors it read: for a
 * reader of a file tensor's own bytes (int4's grid). */
void kwk_model_drop_pages(const struct kwk_model *m, const void *p, size_t n);
const struct kwk_tensor_ref *kwk_model_mat_tensor(const struct kwk_model *m,
                                                  const struct kwk_mat *w, int *n_head);
int64_t kwk_model_file_row(int64_t r, int64_t rows, int n_head);

/* A 4-bit grid of n elements of one row of a Q4_0, Q4_1 or Q4_K tensor: q[n] the codes in
 * [0, 15] and, per group of 32, d[n / 32] and m[n / 32] with element k = d * q[k] + m (as the
 * file's dequantization computes it, to float rounding: Q4_K's d * scale and dmin * min are
 * products of a half and a 6-bit integer). Returns 0, or -1 for another type (nothing written). */
int kwk_dequant_grid4(int dtype, const void *src, int64_t n, uint8_t *q, float *d, float *m);

/* out[d_model] = the embedding row of token id (0 <= id < n_vocab): the float32 table's row, or
 * that one row dequantized from the file when the table is lazy (the same floats). k reads a
 * non-lazy table (the caller's kernel table). Thread-safe; no allocation. */
void kwk_model_embed_row(const struct kwk_model *m, const struct kwk_kernels *k, int64_t id,
                         float *out);

#endif
