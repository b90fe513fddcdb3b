/* kwker.h - the one public header of libkwker: the C ABI used by the CLI and the Python binding.
 *
 * Conventions (see docs/architecture.md):
 *  - Actions return int: 0 on success, a negative code on failure (-errno for the OS, KWK_E* for
 *    our own). Constructors return a pointer or NULL and fill an optional struct kwk_err.
 *  - Every _free accepts NULL. Whoever allocates frees.
 *  - Each function says whether it is thread-safe. Handles are not shared between threads unless
 *    a function says so.
 *  - Enum values that reach files or the ABI are only ever appended.
 */
#ifndef KWKER_H
#define KWKER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KWK_BUILDING) && defined(__GNUC__)
#define KWK_API __attribute__((visibility("default")))
#else
#define KWK_API
#endif

#define KWK_VERSION_MAJOR 0
#define KWK_VERSION_MINOR 1
#define KWK_VERSION_PATCH 0

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

/* Our own codes live in [-10999, -10000]; anything else negative is -errno. */
enum kwk_status {
    KWK_OK = 0,
    KWK_EFORMAT = -10001,      /* a file or text is malformed (message names file and problem) */
    KWK_EUNSUPPORTED = -10002, /* well-formed but not something Kwker runs (message says why) */
    KWK_ELIMIT = -10003,       /* an explicit limit was hit (size, depth, steps, length) */
    KWK_EARG = -10004,         /* a caller passed an invalid argument */
    KWK_ERANGE = -10005,       /* an index (token id, position) is out of range */
    KWK_ESYNTAX = -10006,      /* a template or pattern has a syntax error (line/column in msg) */
    KWK_ERUNTIME = -10007,     /* a template raised, or evaluation failed on its data */
    KWK_ENOTFOUND = -10008,    /* a file, id, key or tensor is missing */
    KWK_ECANCELED = -10009,    /* the operation was cancelled */
};

#define KWK_ERR_MSG_MAX 512

/* Filled by constructors and parsers on failure. pos is a byte offset into the input for
 * parsers (or -1 when not meaningful); line/col are 1-based for text inputs, 0 otherwise. */
struct kwk_err {
    int code;
    int64_t pos;
    int line;
    int col;
    char msg[KWK_ERR_MSG_MAX];
};

/* Short static text for a status code. Thread-safe. */
KWK_API const char *kwk_status_str(int code);

/* ---------------------------------------------------------------------------------------------
 * Machine
 * ------------------------------------------------------------------------------------------- */

enum kwk_isa { KWK_ISA_SCALAR = 0, KWK_ISA_AVX2 = 1, KWK_ISA_AVX512 = 2 };

/* The instruction set chosen for kernels: the best this CPU and OS support, lowered by the
 * environment variable KWKER_ISA=scalar|avx2|avx512 (never raised above what the CPU has).
 * Detected once; thread-safe. */
KWK_API int kwk_isa(void);
KWK_API const char *kwk_isa_name(int isa);

/* Cores the thread pool uses by default. Thread-safe. */
KWK_API int kwk_default_threads(void);

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------- */

typedef struct kwk_model kwk_model;

enum kwk_arch {
    KWK_ARCH_UNKNOWN = 0,
    KWK_ARCH_LLAMA = 1,
    KWK_ARCH_MISTRAL = 2,
    KWK_ARCH_QWEN2 = 3,
    KWK_ARCH_QWEN3 = 4,
};

struct kwk_model_info {
    int arch;              /* enum kwk_arch */
    int n_vocab;
    int n_layers;
    int d_model;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int d_ff;
    int max_position;      /* max_position_embeddings (0 when unknown) */
    int bos_id;            /* -1 when unknown */
    int n_eos;             /* eos ids from generation_config.json / config / GGUF */
    int eos_ids[8];
    int64_t n_params;      /* parameters, tied embeddings counted once */
    char arch_name[64];    /* as the checkpoint names it, e.g. "LlamaForCausalLM" or "llama" */
};

/* Load a model: a folder with config.json + safetensors, a .gguf file, or a Hugging Face id
 * (ORG/NAME) found offline in the local Hugging Face cache. Weights are memory-mapped read-only;
 * quantized GGUF tensors are dequantized to float32 on load.
 * Returns NULL on failure with err filled (the message names the file and what is wrong).
 * Thread-safe (independent calls). The model is immutable after load: decoders on several
 * threads may share one model. */
KWK_API kwk_model *kwk_model_load(const char *path_or_id, struct kwk_err *err);
KWK_API void kwk_model_free(kwk_model *m);
KWK_API void kwk_model_get_info(const kwk_model *m, struct kwk_model_info *info);

/* Whether a model can run with a cache of max_cache_len positions, without loading weights.
 * Returns 0 when it can; otherwise a negative code and a one-line reason in reason[cap].
 * Thread-safe. */
KWK_API int kwk_model_check(const char *path_or_id, int max_cache_len, char *reason, size_t cap);

/* Resolve a Hugging Face id (ORG/NAME) to a snapshot folder in the local cache
 * (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub), never the network. A path that exists
 * is returned unchanged. Returns 0 or KWK_ENOTFOUND / KWK_ELIMIT. Thread-safe. */
KWK_API int kwk_hf_resolve(const char *path_or_id, char *out, size_t cap, struct kwk_err *err);

/* ---------------------------------------------------------------------------------------------
 * Decoders: a KV cache and scratch over a shared model
 * ------------------------------------------------------------------------------------------- */

typedef struct kwk_decoder kwk_decoder;

enum kwk_precision {
    KWK_PRECISION_PRESERVE = 0, /* the checkpoint's own numbers, float32 math */
    KWK_PRECISION_BALANCED = 1, /* 8-bit weights (later issue) */
    KWK_PRECISION_INT4 = 2,     /* 4-bit weights (later issue) */
};

struct kwk_decoder_params {
    int max_cache_len; /* KV cache positions; 0 = min(max_position, 4096) */
    int n_threads;     /* 0 = kwk_default_threads() */
    int precision;     /* enum kwk_precision */
};

KWK_API void kwk_decoder_params_init(struct kwk_decoder_params *p);

/* Create a decoder with its own KV cache and thread pool. Returns NULL with err on failure.
 * The model must outlive the decoder. A decoder is used by one thread at a time. */
KWK_API kwk_decoder *kwk_decoder_new(const kwk_model *m, const struct kwk_decoder_params *p,
                                     struct kwk_err *err);
KWK_API void kwk_decoder_free(kwk_decoder *d);

/* Positions held in the KV cache. */
KWK_API int kwk_decoder_pos(const kwk_decoder *d);
/* Keep the first n positions of the KV cache (0 empties it). Returns 0 or KWK_ERANGE. */
KWK_API int kwk_decoder_truncate(kwk_decoder *d, int n);

enum kwk_logits_mode {
    KWK_LOGITS_NONE = 0, /* compute nothing past the last layer */
    KWK_LOGITS_LAST = 1, /* logits[n_vocab] for the last token */
    KWK_LOGITS_ALL = 2,  /* logits[n_ids][n_vocab] for every token */
};

/* Append n_ids tokens at the current position (batched when n_ids > 1) and write logits as the
 * mode says. Returns 0; KWK_ERANGE for an id outside the vocabulary; KWK_ELIMIT when the cache
 * would overflow (nothing is appended then). */
KWK_API int kwk_decoder_eval(kwk_decoder *d, const int32_t *ids, int n_ids, float *logits,
                             int mode);

/* Greedy generation from an empty cache: prompt, then up to max_new tokens, stopping after any
 * id in eos[n_eos]. Writes the new tokens to out[max_new] and their count to *n_out.
 * Returns 0 or a negative code. */
KWK_API int kwk_decoder_generate_greedy(kwk_decoder *d, const int32_t *prompt, int n_prompt,
                                        int max_new, const int32_t *eos, int n_eos, int32_t *out,
                                        int *n_out);

/* Pointer to the last logits row computed by kwk_decoder_eval (n_vocab floats), valid until the
 * next call on the decoder. */
KWK_API const float *kwk_decoder_logits(const kwk_decoder *d);

/* ---------------------------------------------------------------------------------------------
 * Tokenizers (section owned by src/text/tokenizer)
 * ------------------------------------------------------------------------------------------- */

/* KWK_TOKENIZER_API */

/* ---------------------------------------------------------------------------------------------
 * Chat templates (section owned by src/text/template)
 * ------------------------------------------------------------------------------------------- */

/* KWK_TEMPLATE_API */

#ifdef __cplusplus
}
#endif

#endif /* KWKER_H */
