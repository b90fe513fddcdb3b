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
    KWK_ARCH_GEMMA3 = 5, /* Gemma 3's text decoder (Gemma3ForCausalLM, GGUF gemma3) */
    KWK_ARCH_BERT = 6,   /* a BERT encoder (BertModel, GGUF bert): embeddings, kwk_encoder */
};

/* How an encoder's token states become one embedding (sentence-transformers' Pooling modes;
 * GGUF's <arch>.pooling_type numbers NONE, MEAN, CLS, LAST alike). */
enum kwk_pooling {
    KWK_POOLING_NONE = 0, /* a decoder, or token states without pooling */
    KWK_POOLING_MEAN = 1, /* mean over the sequence's tokens */
    KWK_POOLING_CLS = 2,  /* the first token's state */
    KWK_POOLING_LAST = 3, /* the last token's state */
    KWK_POOLING_MAX = 4,  /* element-wise max over the tokens */
    KWK_POOLING_MEAN_SQRT_LEN = 5, /* the sum over the tokens / sqrt(tokens) */
};

/* What turns a classification head's logits into scores (kwk_model_info.score_act). */
enum kwk_score_act {
    KWK_SCORE_IDENTITY = 0, /* the logits themselves */
    KWK_SCORE_SIGMOID = 1,  /* 1 / (1 + exp(-logit)), each label alone */
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
    /* Encoders (is_encoder 1): what kwk_encoder_embed does by default, from the model folder's
     * sentence-transformers files (1_Pooling/config.json, a Normalize module in modules.json)
     * or GGUF's <arch>.pooling_type (normalized, as llama.cpp's server does); without either,
     * the first token's state, normalized (vLLM's default for BERT). Decoders: 0, NONE, 0. */
    int is_encoder;
    int pooling;           /* enum kwk_pooling */
    int normalize;         /* 1: embeddings scaled to unit L2 length */
    /* Cross-encoders (rerankers) and text classifiers: a *ForSequenceClassification checkpoint
     * of an encoder, or a GGUF with llama.cpp's rank head (cls, cls.output). n_labels is the
     * head's outputs (1 for a reranker), 0 without a head; score_act how sentence-transformers'
     * CrossEncoder turns its logits into scores (config.json's
     * sentence_transformers.activation_fn; without it sigmoid for one label, else identity). */
    int n_labels;
    int score_act;         /* enum kwk_score_act */
    /* Encoders: the longest sequence, special tokens included, as sentence-transformers
     * truncates: max_seq_length from sentence_bert_config.json (read in a folder with
     * modules.json, as sentence-transformers does), else the tokenizer's model_max_length
     * (tokenizer_config.json; CrossEncoder's max_length), never above the positions;
     * max_tokens is that limit (kwk_encoder_max_tokens). The two read values are 0 when absent
     * or not a positive whole number, INT32_MAX when above it (transformers' 1e30: no limit).
     * GGUF: 0, 0 and max_position, as llama.cpp. Decoders: 0, 0, 0. */
    int max_seq_length;
    int model_max_length;
    int max_tokens;
};

/* Load a model: a folder with config.json + safetensors, a .gguf file, or a Hugging Face id
 * (ORG/NAME) found offline in the local Hugging Face cache. Weights are memory-mapped read-only;
 * quantized GGUF tensors are dequantized to float32 only while a float user needs them (a
 * preserve decoder, packing, calibration), so a balanced / int4 process holds its pack, not a
 * float32 copy of the checkpoint.
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
    KWK_PRECISION_BALANCED = 1, /* 8-bit weights, 16-bit activations */
    KWK_PRECISION_INT4 = 2,     /* 4-bit weights, some kept wider (mix_bits) */
};

struct kwk_decoder_params {
    int max_cache_len; /* KV cache positions; 0 = min(max_position, 4096) */
    int n_threads;     /* 0 = kwk_default_threads() */
    int precision;     /* enum kwk_precision */
    /* Packed-weight cache for balanced / int4 (NULL or "": packed in memory at every load),
     * and for preserve, which with a cache runs a bf16 checkpoint as panels on AVX2 CPUs (the
     * same values, laid out for the kernels; without one it reads the checkpoint in place): a
     * directory holding one pack file per model x precision, keyed by the weights' content
     * (created if missing). NULL or "" = no cache.
     * Borrowed: read during kwk_decoder_new only. An unusable directory only logs a warning. */
    const char *cache_dir;
    int64_t cache_max_bytes; /* the directory's size limit, least recently used packs removed
                              * first; 0 = $KWKER_CACHE_MAX (bytes, K/M/G suffix) or 16 GiB */
    /* How balanced / int4 weights are fitted (ignored by preserve): */
    int mix_bits; /* int4: bits of the matrices it keeps wider (the lm_head, and the value and
                   * down projections of a third of the layers; from a GGUF file that mixes
                   * 4-bit matrices with wider quantized ones, as a Q4_K_M does, also every
                   * matrix the file holds wider than 4 bits): 8, 6, or 4 (none kept wider);
                   * 0 = 6 from a billion parameters, 8 below. Other precisions: 0 only. */
    const int32_t *calib; /* calibration token ids (NULL: none): activation-aware scales are
                           * fitted to the model's activations on them (AWQ). Borrowed: read
                           * during kwk_decoder_new only. Part of the pack cache's key. */
    int64_t n_calib;
    int gptq; /* 1: GPTQ on top, fitting each matrix's rounding to its calibration inputs
               * (needs calib) */
    /* How balanced / int4 matrices (the lm_head included) read their activations: 16 = as two
     * 8-bit halves (two int8 dot-product passes, Kwker's default), 8 = rounded to 8 bits (one
     * pass, llama.cpp's precision: faster prompts, perplexity a few tenths of a percent higher).
     * 0 = 16. Changes no weight: the same pack file (and cache key) serves both. Preserve
     * computes in float32 and takes only 0 or 16 (8 is refused: there is nothing to quantize).
     * Other values: KWK_EARG. */
    int act_bits;
    /* KV cache elements: 16 = IEEE half (half the bytes a generated token reads from the cache),
     * 32 = float32. 0 = 16 for balanced and int4, 32 for preserve (which keeps transformers'
     * float32 numbers). Other values: KWK_EARG. */
    int kv_bits;
};

KWK_API void kwk_decoder_params_init(struct kwk_decoder_params *p);

/* Create a decoder with its own KV cache and thread pool. Returns NULL with err on failure.
 * The model must outlive the decoder. A decoder is used by one thread at a time. */
KWK_API kwk_decoder *kwk_decoder_new(const kwk_model *m, const struct kwk_decoder_params *p,
                                     struct kwk_err *err);
KWK_API void kwk_decoder_free(kwk_decoder *d);

/* Positions held in the KV cache. */
KWK_API int kwk_decoder_pos(const kwk_decoder *d);
/* Bits per weight of the matrices a token reads (every layer's and the lm_head): the packed
 * blocks' for balanced / int4 (scales included), the checkpoint's storage for preserve (32 for
 * float32, 16 for bf16 / f16; a quantized GGUF is read as float32 by preserve: 32). */
KWK_API double kwk_decoder_bits_per_weight(const kwk_decoder *d);
/* Bits of a KV cache element: 16 (half) or 32 (float), as kwk_decoder_params.kv_bits chose. */
KWK_API int kwk_decoder_kv_bits(const kwk_decoder *d);
/* The attention kernels a decoder runs: the instruction set's name ("scalar", "avx2", "avx512"),
 * or "avx512-bf16" when 8-bit activations on an AVX512_BF16 CPU take attention's products in
 * bfloat16. A static string. */
KWK_API const char *kwk_decoder_attn_name(const kwk_decoder *d);
/* The kernels a decoder's prompt products (every layer's matrices) run on: "amx-int8" where
 * AMX's tile multiplies take balanced / int4 prompts, "amx-bf16" where they take preserve's bf16
 * products, otherwise the kernel table's instruction set ("scalar", "avx2", "avx512"). A
 * generated token's products run on that instruction set's vector kernels either way (on
 * preserve's tile-ordered weights a step of 2+ tokens takes tiles). A static string. */
KWK_API const char *kwk_decoder_matmul_name(const kwk_decoder *d);
/* Keep the first n positions of the KV cache (0 empties it). Returns 0 or KWK_ERANGE. */
KWK_API int kwk_decoder_truncate(kwk_decoder *d, int n);
/* The token ids held in the KV cache (kwk_decoder_pos of them), valid until the next call. */
KWK_API const int32_t *kwk_decoder_tokens(const kwk_decoder *d);
/* Prompt reuse: keep the longest prefix of the cache that equals ids[n] (at most n-1 tokens,
 * so that the last prompt token is evaluated again and yields logits) and drop the rest.
 * Returns the number of positions kept: the prompt tokens that need not be read again. */
KWK_API int kwk_decoder_reuse_prefix(kwk_decoder *d, const int32_t *ids, int n);

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
 * Sampling (section owned by src/runtime/sample)
 * ------------------------------------------------------------------------------------------- */

/* A sampler turns one row of logits into the next token with Hugging Face transformers'
 * semantics and order (model.generate's _get_logits_processor):
 *
 *   1. logit_bias        added (transformers' sequence_bias with one-token sequences, which it
 *                        applies first; OpenAI's logit_bias)
 *   2. repetition_penalty on every token seen in prompt + output, once per token: a logit < 0 is
 *                        multiplied by the penalty, otherwise divided
 *   3. min_new_tokens    eos ids set to -inf while fewer than min_new_tokens tokens were generated
 *   4. presence/frequency (OpenAI) logit -= presence * [count > 0] + frequency * count, where
 *                        count is how often the token was *generated* (prompt tokens do not count,
 *                        as OpenAI and vLLM); placed where generate() puts a caller's processor
 *   -- greedy (do_sample == 0 or temperature == 0) stops here: argmax, first index on ties --
 *   5. temperature       logits / temperature (skipped when 1)
 *   6. top_k             logits below the k-th largest set to -inf (ties with it are kept; 0 off)
 *   7. top_p             ascending sort, cumulative softmax, entries with cum <= 1 - top_p set to
 *                        -inf, the largest always kept (1 off). Among exactly equal logits
 *                        straddling the cut, the lower index counts as more likely (transformers
 *                        leaves that order to an unstable sort)
 *   8. min_p             tokens with p < min_p * max p set to -inf (0 off), the top one kept
 *
 * Draws: the processed distribution is sampled by inverse CDF in token-index order with the
 * uniform kwk_rng_u01(seed, 0, n) where n is the number of generated tokens accepted so far, so a
 * token's draw depends only on the seed and its position in the output: never on threads,
 * batching or how many candidate tokens a speculative step checked.
 *
 * logprobs are OpenAI's: the log-softmax of the raw (unprocessed) logits.
 *
 * A sampler owns all its scratch: kwk_sampler_process / _sample do not allocate. One thread at
 * a time per sampler; distinct samplers are independent. */

typedef struct kwk_sampler kwk_sampler;

#define KWK_SAMPLER_TOP_MAX 20 /* most top_logprobs a call returns (OpenAI's limit) */

struct kwk_sampler_params {
    int do_sample;             /* 0: greedy (steps 1-4, then argmax) */
    double temperature;        /* >= 0, finite; 0 means greedy (as OpenAI); 1 off */
    int top_k;                 /* >= 0; 0 off */
    double top_p;              /* (0, 1]; 1 off */
    double min_p;              /* [0, 1]; 0 off */
    double repetition_penalty; /* > 0, finite; 1 off */
    double presence_penalty;   /* [-2, 2] (OpenAI's range); 0 off */
    double frequency_penalty;  /* [-2, 2]; 0 off */
    int min_new_tokens;        /* >= 0; needs kwk_sampler_set_eos to matter */
    uint64_t seed;             /* any value; the whole stream of draws follows from it */
};

/* Defaults of transformers' generate(): greedy, temperature 1, top_k 50 (note: OpenAI has no
 * top-k, so an OpenAI route sets top_k = 0), top_p 1, min_p 0, penalties off, seed 0. */
KWK_API void kwk_sampler_params_init(struct kwk_sampler_params *p);

/* Check params; 0 or KWK_EARG with err naming the field and the allowed range. Thread-safe. */
KWK_API int kwk_sampler_params_check(const struct kwk_sampler_params *p, struct kwk_err *err);

/* A sampler for rows of n_vocab logits. Returns NULL with err (KWK_EARG for bad params or
 * n_vocab < 1, -ENOMEM). p is copied. */
KWK_API kwk_sampler *kwk_sampler_new(int n_vocab, const struct kwk_sampler_params *p,
                                     struct kwk_err *err);
KWK_API void kwk_sampler_free(kwk_sampler *s);

/* Replace the logit bias with biases[i] for ids[i] (n = 0 clears it). A repeated id: the last
 * value wins. Returns 0, KWK_ERANGE for an id outside [0, n_vocab), KWK_EARG for a bias outside
 * [-100, 100] (OpenAI's range) or not finite, -ENOMEM; on error the old bias is kept. */
KWK_API int kwk_sampler_set_logit_bias(kwk_sampler *s, const int32_t *ids, const float *biases,
                                       int n, struct kwk_err *err);

/* Set the eos ids that min_new_tokens suppresses (replaces the previous list; n = 0 clears).
 * Returns 0, KWK_ERANGE, -ENOMEM. */
KWK_API int kwk_sampler_set_eos(kwk_sampler *s, const int32_t *ids, int n);

/* Record a token of the history: every prompt token with is_prompt = 1, then each token
 * generated with is_prompt = 0 (these advance the draw counter and count for min_new_tokens
 * and presence/frequency). Returns 0 or KWK_ERANGE. */
KWK_API int kwk_sampler_accept(kwk_sampler *s, int32_t token, int is_prompt);

/* Undo one kwk_sampler_accept of this token with the same is_prompt (the history is a multiset:
 * order does not matter), e.g. to roll back speculated tokens. Returns 0, KWK_ERANGE, or
 * KWK_EARG when no such accept is recorded. */
KWK_API int kwk_sampler_unaccept(kwk_sampler *s, int32_t token, int is_prompt);

/* Forget the history (prompt and output); params, bias and eos ids stay. */
KWK_API void kwk_sampler_reset(kwk_sampler *s);

/* Generated tokens accepted so far: the index of the next draw. */
KWK_API int64_t kwk_sampler_n_generated(const kwk_sampler *s);

/* The distribution the next token is drawn from, into probs[n_vocab] (may be NULL to only
 * validate): steps 1-8 then softmax; for greedy a one-hot at the argmax. logits[n_vocab] is not
 * modified. Returns 0; KWK_EARG when a logit is NaN or +inf; KWK_ERUNTIME when every token ends
 * at -inf (nothing can be chosen). */
KWK_API int kwk_sampler_process(kwk_sampler *s, const float *logits, float *probs);

/* Choose the next token from logits[n_vocab] into *token. Optional outputs (NULL / 0 to skip):
 * *logprob of the token and the n_top (<= KWK_SAMPLER_TOP_MAX) most likely tokens with their
 * logprobs in top_ids/top_lps, most likely first, lower id first on ties. Logprobs are of the
 * raw logits. Does not record the token: call kwk_sampler_accept(s, token, 0) once it is kept.
 * Returns as kwk_sampler_process, or KWK_EARG for n_top out of range. */
KWK_API int kwk_sampler_sample(kwk_sampler *s, const float *logits, int32_t *token,
                               float *logprob, int32_t *top_ids, float *top_lps, int n_top);

/* Index drawn from probs[n] (non-negative, any positive total) by inverse CDF in index order
 * with u in [0, 1): the first i whose running sum exceeds u * total. -1 when the total is not
 * positive. Thread-safe; for speculative sampling's residual draws. */
KWK_API int kwk_sample_draw(const float *probs, int n, double u);

/* Philox4x32-10 (Salmon et al. 2011), counter-based: the four 32-bit words of block
 * (stream, counter) under key seed. Pure, thread-safe. */
KWK_API void kwk_rng_block(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]);
/* A uniform double in [0, 1) with 53 random bits from the block (stream, counter). */
KWK_API double kwk_rng_u01(uint64_t seed, uint64_t stream, uint64_t counter);

/* ---------------------------------------------------------------------------------------------
 * Tokenizers (section owned by src/text/tokenizer)
 * ------------------------------------------------------------------------------------------- */

typedef struct kwk_tokenizer kwk_tokenizer;

/* Load a tokenizer from: a folder with tokenizer.json (plus tokenizer_config.json,
 * special_tokens_map.json, generation_config.json, chat_template.jinja beside it), a legacy
 * folder (vocab.json + merges.txt: byte-level BPE; vocab.txt: WordPiece), a tokenizer.json
 * file, a .gguf file (tokenizer.ggml.*), or a Hugging Face id found in the local cache.
 * Returns NULL with err filled on failure; a malformed tokenizer.json gives KWK_EFORMAT with
 * err->pos / line / col of the JSON error. The tokenizer is immutable after load: every
 * function below may be called from several threads at once on one tokenizer. */
KWK_API kwk_tokenizer *kwk_tokenizer_load(const char *path_or_id, struct kwk_err *err);
/* The same from tokenizer.json text in memory (no files beside it). */
KWK_API kwk_tokenizer *kwk_tokenizer_load_json(const char *json, size_t len,
                                               struct kwk_err *err);
KWK_API void kwk_tokenizer_free(kwk_tokenizer *t);

/* Encode text[len] (UTF-8; invalid bytes are replaced by U+FFFD first, as Python's
 * bytes.decode("utf-8", errors="replace") does before Hugging Face sees the text). Added and
 * special tokens written in the text are always recognized; add_special adds the
 * post-processor's tokens (e.g. BOS). Writes up to cap ids and the full count to *n; returns 0,
 * or KWK_ELIMIT when cap < *n (ids then holds the first cap ids), or another negative code. */
KWK_API int kwk_tokenizer_encode(const kwk_tokenizer *t, const char *text, size_t len,
                                 int add_special, int32_t *ids, size_t cap, size_t *n);
/* The same into a buffer allocated by the library (*ids, freed with kwk_tokenizer_mem_free). */
KWK_API int kwk_tokenizer_encode_alloc(const kwk_tokenizer *t, const char *text, size_t len,
                                       int add_special, int32_t **ids, size_t *n);
/* The same with each id's byte span in the text: offsets[2*i] .. offsets[2*i+1] (allocated
 * like ids; tokens the post-processor adds get 0, 0; a prefix space ByteLevel adds is not part
 * of the span). Offsets are into the text after U+FFFD repair (the same bytes when it is valid
 * UTF-8). Returns KWK_EUNSUPPORTED when the normalizer or a pre-tokenizer rewrote this text
 * (e.g. lowercasing, Metaspace), as byte spans are then not kept. */
KWK_API int kwk_tokenizer_encode_offsets(const kwk_tokenizer *t, const char *text, size_t len,
                                         int add_special, int32_t **ids, uint32_t **offsets,
                                         size_t *n);
KWK_API void kwk_tokenizer_mem_free(void *p);

/* Encode a pair of texts as one sequence, as Hugging Face's tokenizer(a, b, truncation=True,
 * max_length=max_tokens) does: each text encoded without special tokens; when max_tokens > 0,
 * the two truncated so the whole, special tokens included, holds at most max_tokens (the
 * "longest_first" strategy: the longer text loses tokens from its end first); then joined by
 * the post-processor's pair form ([CLS] a [SEP] b [SEP] for BERT, <s> a </s></s> b </s> for
 * RoBERTa, a TemplateProcessing's "pair"; a then b when no post-processor adds tokens, as for
 * most decoders; a GGUF's as llama.cpp's rerank prompt joins them: [bos] a [eos] [sep] b [eos]
 * by its add_*_token flags). An empty b keeps the pair form, as the tokenizers library and
 * transformers' batched call do (transformers 5's unbatched call encodes a alone then).
 * Allocates *ids and, when types is not NULL, *types (each token's type id, the
 * token_type_ids: 0 for a's part, 1 for b's where the post-processor says so), both freed with
 * kwk_tokenizer_mem_free; *n is the count. Returns 0; KWK_EUNSUPPORTED when the tokenizer has
 * no pair form (a tokenizer.json whose TemplateProcessing lacks "pair", or whose Sequence holds
 * two token-adding processors: files Hugging Face refuses or mangles); KWK_ELIMIT when
 * 0 < max_tokens < the special tokens the pair adds (Hugging Face then silently leaves the
 * pair whole), or when a template naming a text twice would still exceed max_tokens (Hugging
 * Face's budget counts each text once; no real template does it). Thread-safe. */
KWK_API int kwk_tokenizer_encode_pair(const kwk_tokenizer *t, const char *a, size_t na,
                                      const char *b, size_t nb, size_t max_tokens,
                                      int32_t **ids, int32_t **types, size_t *n);
/* The same from the two texts' ids, each as kwk_tokenizer_encode(add_special 0) gives them: a
 * text encoded once joins many pairs (a reranker's query with each of its documents). Both are
 * thread-safe, as every tokenizer call. */
KWK_API int kwk_tokenizer_join_pair(const kwk_tokenizer *t, const int32_t *a, size_t na,
                                    const int32_t *b, size_t nb, size_t max_tokens,
                                    int32_t **ids, int32_t **types, size_t *n);

/* Decode ids[n] to UTF-8 text exactly as Hugging Face's decode does (skip_special drops
 * special added tokens). Writes a NUL-terminated string to buf[cap] and its length to *len;
 * returns 0, KWK_ELIMIT when cap <= *len (nothing useful in buf; *len is the length needed),
 * KWK_ERANGE for an id outside [0, n_vocab). */
KWK_API int kwk_tokenizer_decode(const kwk_tokenizer *t, const int32_t *ids, size_t n,
                                 int skip_special, char *buf, size_t cap, size_t *len);
/* The same into a NUL-terminated buffer allocated by the library (kwk_tokenizer_mem_free). */
KWK_API int kwk_tokenizer_decode_alloc(const kwk_tokenizer *t, const int32_t *ids, size_t n,
                                       int skip_special, char **text, size_t *len);

/* Ids are in [0, n_vocab); some ids may have no piece (holes), which decode skips. */
KWK_API int kwk_tokenizer_n_vocab(const kwk_tokenizer *t);
/* The vocabulary string of id (as stored, e.g. "Ġthe" or "▁the"), NUL-terminated and owned by
 * the tokenizer; NULL when id is out of range or a hole. */
KWK_API const char *kwk_tokenizer_id_to_piece(const kwk_tokenizer *t, int32_t id, size_t *len);
/* The id of a vocabulary string (model vocabulary or added token), or -1. */
KWK_API int32_t kwk_tokenizer_piece_to_id(const kwk_tokenizer *t, const char *piece,
                                          size_t len);
/* The bytes token id adds to a text it is decoded in the middle of (llama.cpp's token_to_piece
 * for constrained decoding): a byte-level token's bytes, which may be part of a UTF-8
 * character; SentencePiece's U+2581 as a space and <0xHH> as that byte; a WordPiece "##"
 * continuation without the "##" and any other WordPiece token after a space; an added token's
 * content. Decode's whole-text steps (strip of the first space, cleanup of spaces before
 * punctuation) are not applied. Writes up to cap bytes
 * to buf and the length to *len; returns 0, KWK_ELIMIT when cap < *len, KWK_ERANGE for an id
 * outside [0, n_vocab) or a hole, -ENOMEM. Thread-safe. */
KWK_API int kwk_tokenizer_token_bytes(const kwk_tokenizer *t, int32_t id, char *buf, size_t cap,
                                      size_t *len);
/* 1 when id is a special added token (skipped by skip_special), 0 otherwise. */
KWK_API int kwk_tokenizer_is_special(const kwk_tokenizer *t, int32_t id);

/* Special ids (-1 when unknown). eos ids: from generation_config.json when it lists them,
 * else the eos token; returns their count and copies up to cap into ids. */
KWK_API int32_t kwk_tokenizer_bos_id(const kwk_tokenizer *t);
KWK_API int32_t kwk_tokenizer_pad_id(const kwk_tokenizer *t);
KWK_API int32_t kwk_tokenizer_unk_id(const kwk_tokenizer *t);
KWK_API int kwk_tokenizer_eos_ids(const kwk_tokenizer *t, int32_t *ids, int cap);
/* bos/eos token strings (NULL when unknown), and the chat template found beside the tokenizer
 * (tokenizer_config.json "chat_template" — the "default" one of a list —, chat_template.jinja,
 * or GGUF tokenizer.chat_template), NULL when none. Owned by the tokenizer. */
KWK_API const char *kwk_tokenizer_bos_token(const kwk_tokenizer *t);
KWK_API const char *kwk_tokenizer_eos_token(const kwk_tokenizer *t);
KWK_API const char *kwk_tokenizer_chat_template(const kwk_tokenizer *t);

/* Incremental detokenizer for streaming: push ids one at a time; each call gives the new text
 * (possibly empty), never a broken UTF-8 sequence; the pieces of every push plus the final
 * flush concatenate to exactly kwk_tokenizer_decode(all ids). *piece stays valid until the
 * next call on d. One detokenizer per stream (not thread-safe); the tokenizer must outlive it. */
typedef struct kwk_detok kwk_detok;
KWK_API kwk_detok *kwk_detok_new(const kwk_tokenizer *t, int skip_special);
/* Keep the text of the special tokens ids[n] even with skip_special (preserved tokens, e.g. a
 * tool call's marker): the stream is then kwk_tokenizer_decode(all ids but the other special
 * ones, skip_special 0). Call before the first push. Ids outside the vocabulary are ignored;
 * ids are copied. Returns 0, KWK_EARG, -ENOMEM. */
KWK_API int kwk_detok_preserve(kwk_detok *d, const int32_t *ids, int n);
KWK_API int kwk_detok_push(kwk_detok *d, int32_t id, const char **piece, size_t *len);
KWK_API int kwk_detok_flush(kwk_detok *d, const char **piece, size_t *len);
KWK_API void kwk_detok_free(kwk_detok *d);

/* ---------------------------------------------------------------------------------------------
 * Grammars: constrained decoding (section owned by src/grammar)
 * ------------------------------------------------------------------------------------------- */

/* A compiled grammar: generated text is kept to its sentences, token by token. The text is
 * llama.cpp's GBNF (its grammars/README.md): rules `name ::= alternatives` (names of letters,
 * digits and '-'), the start rule `root`; literals "..." and character classes [a-z0-9_] / [^"\\]
 * with the escapes \n \r \t \\ \" \] \- \xHH \uHHHH \UHHHHHHHH; `.` (any one character);
 * grouping ( ); repetition * + ? {m} {m,} {m,n}; comments from # to the end of the line.
 * Characters are Unicode code points matched as their UTF-8 bytes, so a token may end inside a
 * character. Left recursion, undefined rules and repetitions beyond KWK_GRAMMAR_REPEAT_MAX are
 * refused with the line and column. Immutable once built: thread-safe to share. */
typedef struct kwk_grammar kwk_grammar;

#define KWK_GRAMMAR_TEXT_MAX (1 << 20)   /* bytes of GBNF (and of a JSON schema) */
#define KWK_GRAMMAR_REPEAT_MAX 10000     /* m and n of {m,n} */

/* Compile GBNF text[len]. NULL with err: KWK_ESYNTAX (line / col / pos), KWK_ELIMIT, -ENOMEM. */
KWK_API kwk_grammar *kwk_grammar_new(const char *text, size_t len, struct kwk_err *err);
/* A grammar for the JSON texts a JSON Schema (draft 2020-12; schema[len] is JSON text) accepts:
 * between tokens it allows what llama.cpp's converter allows (nothing, one space, or a newline
 * and up to 20 spaces or tabs), so a model may print compact or indented JSON but not pad
 * forever. The grammar may be narrower than the schema, never wider (but for dates: days up to
 * 31 in any month): integers are written without a fraction (1, not 1.0), the formats date,
 * time, date-time and uuid are enforced, oneOf only where no value can match two branches.
 * Keywords that would constrain the output but cannot be enforced are
 * refused (KWK_EUNSUPPORTED naming the keyword and its JSON pointer), never ignored;
 * annotations (title, description, examples, default, $comment, ...) are ignored. */
KWK_API kwk_grammar *kwk_grammar_from_json_schema(const char *schema, size_t len,
                                                  struct kwk_err *err);
/* The GBNF text of that grammar (NUL-terminated, *out_len bytes; free with kwk_string_free):
 * objects list their properties in the schema's order, required or not. Thread-safe. */
KWK_API int kwk_json_schema_to_gbnf(const char *schema, size_t len, char **out, size_t *out_len,
                                    struct kwk_err *err);
KWK_API void kwk_grammar_free(kwk_grammar *g);

/* 1 when text[len] is a whole sentence of g, 0 when it is not; *prefix (may be NULL) is set to 1
 * when text can still be continued into one. Negative (KWK_ELIMIT) when matching exceeded the
 * matcher's limits. Thread-safe. */
KWK_API int kwk_grammar_match(const kwk_grammar *g, const char *text, size_t len, int *prefix);

/* The bytes each token of a vocabulary adds to text, arranged for masks (a trie). Built once
 * per tokenizer and shared by every matcher of it: immutable, thread-safe. */
typedef struct kwk_grammar_vocab kwk_grammar_vocab;
/* From a tokenizer: special tokens and holes are never allowed by a grammar (eos is the
 * generation's business: see kwk_gen_params.grammar), unless a matcher preserves a special
 * one (kwk_matcher_preserve): the vocabulary keeps their bytes for that. */
KWK_API kwk_grammar_vocab *kwk_grammar_vocab_new(const kwk_tokenizer *tok, struct kwk_err *err);
/* From byte strings: token i adds bytes[i][0 .. lens[i]) (NULL or length 0: never allowed). */
KWK_API kwk_grammar_vocab *kwk_grammar_vocab_from_bytes(const char *const *bytes,
                                                        const uint32_t *lens, int32_t n,
                                                        struct kwk_err *err);
KWK_API int32_t kwk_grammar_vocab_size(const kwk_grammar_vocab *v);
KWK_API void kwk_grammar_vocab_free(kwk_grammar_vocab *v);

/* One generation's position in a grammar. Not thread-safe (one per sequence); g and v must
 * outlive it. */
typedef struct kwk_matcher kwk_matcher;
KWK_API kwk_matcher *kwk_matcher_new(const kwk_grammar *g, const kwk_grammar_vocab *v,
                                     struct kwk_err *err);
KWK_API void kwk_matcher_free(kwk_matcher *m);
/* Back to the start of the grammar; the tokens kwk_matcher_preserve let in stay preserved. */
KWK_API void kwk_matcher_reset(kwk_matcher *m);
/* Let the special tokens ids[n] of the vocabulary (built by kwk_grammar_vocab_new) be matched
 * as their text, as any other token (kwk_gen_params.preserved_ids). Ids that are usable
 * already, outside the vocabulary or without text are ignored; ids are copied. Returns 0,
 * KWK_EARG, -ENOMEM. */
KWK_API int kwk_matcher_preserve(kwk_matcher *m, const int32_t *ids, int n);
/* The tokens that may come next: bit i of allowed[i / 32] is set for token i
 * (allowed[(n_vocab + 31) / 32] words). Returns how many are allowed, or a negative code
 * (KWK_ELIMIT when the grammar is too ambiguous here). */
KWK_API int32_t kwk_matcher_mask(kwk_matcher *m, uint32_t *allowed);
/* 1 when token may come next, 0 when not (cheaper than a mask for one token); a negative code
 * (KWK_ELIMIT, -ENOMEM) when the matcher could not tell. */
KWK_API int kwk_matcher_allows(kwk_matcher *m, int32_t token);
/* Advance by token (0), or KWK_EARG when the grammar does not allow it (nothing changes),
 * KWK_ERANGE for an id outside the vocabulary. */
KWK_API int kwk_matcher_accept(kwk_matcher *m, int32_t token);
/* The same with raw bytes (e.g. text forced by the caller). */
KWK_API int kwk_matcher_accept_bytes(kwk_matcher *m, const char *bytes, size_t len);
/* 1 when the text so far is a whole sentence (the generation may end here), else 0. */
KWK_API int kwk_matcher_done(const kwk_matcher *m);
/* 1 when no byte can follow (the text is whole and cannot go on). */
KWK_API int kwk_matcher_finished(const kwk_matcher *m);

/* ---------------------------------------------------------------------------------------------
 * Generation: sampling, stopping, prompt reuse and speculation over a decoder
 * ------------------------------------------------------------------------------------------- */

enum kwk_finish {
    KWK_FINISH_NONE = 0,
    KWK_FINISH_STOP = 1,     /* an eos id or a stop string */
    KWK_FINISH_LENGTH = 2,   /* max_new_tokens, or the KV cache is full */
    KWK_FINISH_CANCELED = 3, /* the token callback asked to stop */
};

/* Called after each accepted token with the text it adds (possibly empty: text that could still
 * turn into a stop string, or half a UTF-8 character, is held back until it is settled). Return
 * non-zero to cancel. text is valid during the call only. */
typedef int (*kwk_token_fn)(void *user, int32_t token, const char *text, size_t len);

struct kwk_gen_params {
    int max_new_tokens;
    struct kwk_sampler_params sampling;
    const int32_t *logit_bias_ids; /* [n_logit_bias] */
    const float *logit_bias;
    int n_logit_bias;
    const int32_t *eos_ids;        /* [n_eos]: generation stops after any of them */
    int n_eos;
    const char *const *stop;       /* [n_stop] stop strings, matched on the text; need tok */
    int n_stop;
    const kwk_tokenizer *tok;      /* for text, stop strings and the callback's text; may be NULL */
    int prompt_cache;              /* 1: keep the cached prefix shared with this prompt */
    int lookup;                    /* n-gram lookup: up to this many candidate tokens a step */
    kwk_decoder *draft;            /* a smaller model with the same vocabulary, or NULL */
    int n_draft;                   /* tokens the draft proposes at first (then adaptive) */
    kwk_token_fn on_token;
    void *user;
    int top_logprobs;              /* 0..KWK_SAMPLER_TOP_MAX alternatives recorded per token */
    /* Constrained decoding: the reply's text is kept to a sentence of grammar (or NULL).
     * Tokens the grammar does not allow next are masked out before sampling (so the sampled
     * distribution is the model's renormalized over the allowed tokens, with top-k / top-p
     * applied after the mask), special tokens are never allowed (but preserved ones: see
     * preserved_ids), and the eos ids only once the
     * text is a whole sentence; when nothing can follow, the reply ends (KWK_FINISH_STOP).
     * Logprobs stay those of the raw logits. Speculation stays exact. With no eos id (or while
     * min_new_tokens holds them back) a whole sentence that could go on does not end the reply
     * (a JSON schema's may take up to a newline and 20 spaces more). grammar and grammar_vocab
     * must outlive the call (for the engine: the request's DONE event). */
    const kwk_grammar *grammar;
    const kwk_grammar_vocab *grammar_vocab; /* tok's vocabulary (kwk_grammar_vocab_new), or
                                             * NULL: kwk_generate builds one for the call, the
                                             * engine one for tok that its requests share */
    /* A lazy grammar (llama.cpp's grammar triggers): with a trigger (NUL-terminated, at most
     * KWK_GRAMMAR_TRIGGER_MAX bytes) the reply is free text until its bytes contain the
     * trigger; from the trigger's first byte on, the text must be a sentence of grammar (whose
     * sentences begin with the trigger, e.g. "<tool_call>"). A token that would bring the
     * trigger with bytes the grammar refuses is set aside and the choice made again (after 64
     * in a row the call fails); special tokens add no bytes, so a trigger spelled by one never
     * fires (unless preserved, below); eos ids end a reply that has not met the trigger. NULL
     * or "": the grammar holds from the reply's first byte. */
    const char *grammar_trigger;
    /* Preserved tokens (llama.cpp's preserved_tokens): special tokens whose text the reply keeps,
     * as a model's control token for a tool call's marker ("[TOOL_CALLS]", "<|python_tag|>").
     * Each id's text (its decode) joins the reply's text where any other special token adds
     * none; a grammar allows it as that text (so a grammar that starts with the marker takes
     * the one token the model emits for it, as well as the same text spelled in plain tokens);
     * a lazy grammar's trigger sees it. The eos ids stay eos ids, never text. Ids outside
     * [0, n_vocab) are KWK_EARG; ids of tokens that are not special change nothing. Copied by
     * the engine; kwk_generate reads them during the call. NULL / 0: none. */
    const int32_t *preserved_ids; /* [n_preserved] */
    int n_preserved;
    /* A thinking model's block (llama.cpp anchors its triggers after it): with a lazy grammar
     * and a think_close (not NULL, not ""), the trigger is not looked for inside the reply's
     * think block, so a call the model drafts while thinking does not set the grammar off.
     * A reply that opens with think_open (after whitespace) is inside the block until
     * think_close appears, and the trigger is looked for only in the bytes after it (bytes
     * after it in the same token count); a reply that does not open with think_open is
     * searched from its start. While the reply's first bytes are whitespace or a proper prefix
     * of think_open, the trigger waits (and then sees them, once they turn out to open no
     * block). think_open NULL or "": the prompt opened the block (the reply starts inside it).
     * Bytes are the trigger's: a special token adds none unless preserved (so a model whose
     * "<think>" is a special token needs it preserved). Each at most KWK_THINK_TAG_MAX bytes
     * (KWK_EARG). Without a lazy grammar they change nothing. Copied by the engine. */
    const char *think_open;
    const char *think_close;
    /* Prompt logprobs (OpenAI's echo with logprobs, vLLM's prompt_logprobs): 1 asks for each
     * prompt token's logprob given the tokens before it, with top_logprobs alternatives, as a
     * KWK_EVENT_PROMPT before the first generated token. The prompt is then read in full (no
     * reuse of a cached prefix, whose logits are gone). Serving engine only: kwk_generate
     * refuses it (KWK_EUNSUPPORTED). */
    int prompt_logprobs;
};

#define KWK_GRAMMAR_TRIGGER_MAX 1024
#define KWK_THINK_TAG_MAX 32

/* Defaults: 16 new tokens, greedy, prompt cache on, lookup 8, no draft. */
KWK_API void kwk_gen_params_init(struct kwk_gen_params *p);

/* What a generation produced. The caller provides tokens[cap] (and logprobs[cap], top_ids and
 * top_lps [cap * top_logprobs], or NULL);
 * text is allocated by the library when a tokenizer was given (free with kwk_gen_output_clear). */
struct kwk_gen_output {
    int32_t *tokens;
    float *logprobs;
    int cap;
    int n_tokens;
    int finish_reason;   /* enum kwk_finish */
    int n_prompt;
    int prompt_reused;   /* prompt tokens found in the KV cache and not read again */
    int n_proposed;      /* speculative candidates checked */
    int n_accepted;      /* of which the model kept */
    int n_steps;         /* forward passes after the prompt */
    char *text;          /* the reply, ending before the first stop string */
    size_t text_len;
    int32_t *top_ids;    /* [cap][top_logprobs] or NULL: the most likely tokens at each step */
    float *top_lps;      /* [cap][top_logprobs] or NULL: their logprobs, most likely first */
};

KWK_API void kwk_gen_output_clear(struct kwk_gen_output *o);

/* Generate from prompt[n_prompt] on decoder d. The tokens are exactly those of a fresh decoder
 * without speculation: prompt reuse only skips work, and speculative candidates are checked
 * against the token the model itself picks at that position (with the same seeded draw).
 * Returns 0, or a negative code with err filled (the output holds what was made before). */
KWK_API int kwk_generate(kwk_decoder *d, const int32_t *prompt, int n_prompt,
                         const struct kwk_gen_params *p, struct kwk_gen_output *out,
                         struct kwk_err *err);

/* ---------------------------------------------------------------------------------------------
 * Serving engine: continuous batching of many requests over one model (src/engine)
 * ------------------------------------------------------------------------------------------- */

/* An engine owns a decoder with max_batch KV slots. Every request in flight holds a slot (its own
 * cache, positions, sampler and text); all of them advance together in one batched forward pass a
 * step, and prompts are read in chunks between decode steps so a long prompt does not freeze the
 * streams already running. A request whose prompt starts with what a free slot still holds reuses
 * those positions (a shared system prompt is read once). Kernels are batch invariant, so a request
 * gets exactly the tokens kwk_generate gives it alone, whatever else is in flight.
 *
 * Threads: kwk_engine_submit, _cancel and _get_stats may be called from any thread at any time.
 * Steps run on one thread: the engine's own (kwk_engine_start) or the caller's (kwk_engine_step),
 * never both. Event callbacks run on the stepping thread and must not block: copy and return. */
typedef struct kwk_engine kwk_engine;

struct kwk_engine_params {
    int max_batch;     /* KV slots = requests in flight; 0 = 8 */
    int max_cache_len; /* positions per slot (prompt + reply); 0 = min(max_position, 4096) */
    int n_threads;     /* 0 = kwk_default_threads() */
    int precision;     /* enum kwk_precision */
    int prefill_chunk; /* prompt tokens read per step, all requests together; 0 = 256 */
    int max_queue;     /* requests waiting for a slot; 0 = 4096 (submit fails KWK_ELIMIT beyond) */
    const char *cache_dir; /* packed-weight cache, as in kwk_decoder_params (NULL: none) */
    int mix_bits;          /* as in kwk_decoder_params */
    const int32_t *calib;  /* as in kwk_decoder_params (borrowed for kwk_engine_new only) */
    int64_t n_calib;
    int gptq;
    int act_bits;          /* as in kwk_decoder_params: 8 or 16 (0 = 16) */
    int kv_bits;           /* as in kwk_decoder_params: 16 or 32 (0 = by precision) */
};

KWK_API void kwk_engine_params_init(struct kwk_engine_params *p);

enum kwk_event_type {
    KWK_EVENT_TOKEN = 1, /* one generated token */
    KWK_EVENT_DONE = 2,  /* the request ended: the last event of its id */
    KWK_EVENT_PROMPT = 3, /* the prompt was read (with prompt_logprobs only): its logprobs */
};

struct kwk_event {
    int type;             /* enum kwk_event_type */
    uint64_t id;          /* from kwk_engine_submit */
    /* KWK_EVENT_TOKEN */
    int32_t token;
    float logprob;        /* of the raw logits (OpenAI's logprobs) */
    int n_top;            /* the request's top_logprobs */
    const int32_t *top_ids; /* [n_top], most likely first */
    const float *top_lps;
    const char *text;     /* the settled text this token adds (may be empty: see kwk_token_fn) */
    size_t len;
    /* KWK_EVENT_DONE */
    int finish_reason;    /* enum kwk_finish; CANCELED after kwk_engine_cancel */
    int status;           /* 0, or a negative code when the request failed (message in err_msg) */
    const char *err_msg;
    int n_prompt;
    int prompt_reused;    /* prompt positions found in the slot's cache and not read again */
    int n_tokens;         /* tokens generated */
    double queue_s;       /* submit to the first step that read its prompt */
    double ttft_s;        /* submit to the first token */
    double total_s;       /* submit to done */
    /* KWK_EVENT_PROMPT: prompt_lps[n_prompt], each prompt token's logprob given those before it
     * (NaN for the first, which has none), and top_ids / top_lps [n_prompt][n_top] its
     * alternatives (the first row's ids -1, logprobs NaN) */
    const float *prompt_lps;
};

/* Called on the stepping thread; pointers in ev are valid during the call only. */
typedef void (*kwk_event_fn)(void *user, const struct kwk_event *ev);

/* Create an engine over m (which must outlive it). NULL with err on failure. */
KWK_API kwk_engine *kwk_engine_new(const kwk_model *m, const struct kwk_engine_params *p,
                                   struct kwk_err *err);
/* Stop the engine's thread if started; every request not yet done gets its DONE event
 * (CANCELED) before this returns. */
KWK_API void kwk_engine_free(kwk_engine *e);

/* Queue a request: prompt ids[n] and p as for kwk_generate (p->on_token, user and draft are not
 * used: events go to fn(user, ...); lookup applies when few requests are in flight). Everything
 * is copied (ids, stop strings, eos ids, logit bias); p->tok must outlive the engine. Returns the
 * request's id (> 0), or 0 with err: KWK_EARG (bad parameters), KWK_ELIMIT (prompt plus
 * max_new_tokens beyond max_cache_len, or the queue is full). Thread-safe. */
KWK_API uint64_t kwk_engine_submit(kwk_engine *e, const int32_t *ids, int n,
                                   const struct kwk_gen_params *p, kwk_event_fn fn, void *user,
                                   struct kwk_err *err);
/* Ask a request to end: it gets its DONE event (CANCELED) at the next step and its slot is
 * freed. Returns 0, KWK_ENOTFOUND when the id is unknown or already done, KWK_EARG without an
 * engine. Thread-safe. */
KWK_API int kwk_engine_cancel(kwk_engine *e, uint64_t id);

/* Run one step on the calling thread: admit queued requests into free slots, then one batched
 * forward pass (prompt chunks and one decode token per running request) and its events. Returns
 * the number of requests still queued or running (0: idle), or a negative code when the forward
 * pass could not run (the requests in it are ended with status set). */
KWK_API int kwk_engine_step(kwk_engine *e);
/* Start the engine's own stepping thread (it sleeps while idle). 0 or a negative code. */
KWK_API int kwk_engine_start(kwk_engine *e, struct kwk_err *err);
/* Stop that thread after its current step; queued and running requests stay. */
KWK_API void kwk_engine_stop(kwk_engine *e);

struct kwk_engine_stats {
    uint64_t submitted, completed, canceled, failed; /* requests */
    uint64_t prompt_tokens, prompt_reused, generated_tokens;
    uint64_t steps, batch_rows;  /* forward passes, and rows summed over them */
    int queued, running;         /* now */
    int max_batch, max_cache_len;
    double ttft_sum_s;           /* over completed requests that produced a token */
    uint64_t ttft_count;
    double busy_s;               /* time spent in steps */
};

/* A consistent snapshot. Thread-safe. */
KWK_API void kwk_engine_get_stats(kwk_engine *e, struct kwk_engine_stats *s);

/* ---------------------------------------------------------------------------------------------
 * Encoders: embeddings of whole sequences
 * ------------------------------------------------------------------------------------------- */

typedef struct kwk_encoder kwk_encoder;

struct kwk_encoder_params {
    int n_threads;    /* 0 = kwk_default_threads() */
    int precision;    /* enum kwk_precision: preserve (the checkpoint's numbers, float32 math:
                         transformers' float32 states), balanced or int4 (matrices packed as a
                         decoder's are; the embeddings, position and layer norms stay float) */
    int act_bits;     /* balanced / int4: 16 (default, 0) or 8, as kwk_decoder_params.act_bits */
    int pooling;      /* enum kwk_pooling; -1 = the model's (kwk_model_info.pooling) */
    int normalize;    /* 1 / 0; -1 = the model's */
    int batch_tokens; /* tokens one forward pass may hold, whole sequences packed together;
                         0 = 2048, raised to the model's max_position so any sequence fits */
    int max_tokens;   /* the longest sequence: 0 = the model's (kwk_model_info.max_tokens), or
                         1..max_position for another (sentence-transformers' max_seq_length
                         set by hand) */
};

KWK_API void kwk_encoder_params_init(struct kwk_encoder_params *p);

/* An encoder with its own thread pool and scratch over a loaded encoder model (is_encoder):
 * KWK_EUNSUPPORTED for a decoder, as kwk_decoder_new is for an encoder. The model must outlive
 * it. Used by one thread at a time. NULL with err on failure. */
KWK_API kwk_encoder *kwk_encoder_new(const kwk_model *m, const struct kwk_encoder_params *p,
                                     struct kwk_err *err);
KWK_API void kwk_encoder_free(kwk_encoder *e);

/* Floats of one embedding (the model's hidden size). */
KWK_API int kwk_encoder_dim(const kwk_encoder *e);
/* Tokens one sequence may hold at most, special tokens included: kwk_model_info.max_tokens
 * (sentence-transformers' max_seq_length, else the tokenizer's model_max_length, at most the
 * model's positions; a GGUF's positions). */
KWK_API int kwk_encoder_max_tokens(const kwk_encoder *e);
/* The pooling and normalization kwk_encoder_embed applies (the params' or the model's). */
KWK_API int kwk_encoder_pooling(const kwk_encoder *e);
KWK_API int kwk_encoder_normalize(const kwk_encoder *e);

/* Embed n_seqs sequences: sequence i is ids[offs[i] .. offs[i + 1]) (offs has n_seqs + 1
 * entries, non-decreasing, offs[0] = 0), its tokens as the tokenizer gives them with special
 * tokens added ([CLS] ... [SEP]). Writes out[n_seqs][dim], pooled (and normalized) as the
 * encoder says. Sequences are packed into passes of batch_tokens, each attending only to its
 * own tokens; a sequence's embedding is bitwise the same whatever it is batched with.
 * Returns 0; KWK_EARG for bad offs or an empty sequence; KWK_ERANGE for an id outside the
 * vocabulary; KWK_ELIMIT for a sequence longer than kwk_encoder_max_tokens (nothing is
 * written then; err names the sequence). err may be NULL. */
KWK_API int kwk_encoder_embed(kwk_encoder *e, const int32_t *ids, const int32_t *offs,
                              int n_seqs, float *out, struct kwk_err *err);

/* The last layer's state of each token of one sequence ids[n], unpooled: out[n][dim]. Returns
 * as kwk_encoder_embed. */
KWK_API int kwk_encoder_states(kwk_encoder *e, const int32_t *ids, int n, float *out,
                               struct kwk_err *err);

/* Outputs of the model's classification head (kwk_model_info.n_labels; 0 without one). Any
 * thread. */
KWK_API int kwk_encoder_n_labels(const kwk_encoder *e);

/* The classification head's logits for n_seqs sequences (ids and offs as kwk_encoder_embed;
 * types[offs[n_seqs]] each token's type id as kwk_tokenizer_encode_pair gives them, NULL for
 * all 0; a model of one token type, as RoBERTa's and XLM-R's, reads every token as type 0):
 * out[n_seqs][n_labels], raw (kwk_model_info.score_act says how scores are made of them). The
 * head reads the first token's state: BERT's pooler (dense, tanh) then classifier; RoBERTa's
 * and XLM-R's classifier.dense, tanh, then out_proj; a GGUF's cls, tanh, cls.output as
 * llama.cpp names them. Bitwise the same whatever a sequence is batched with. Returns as
 * kwk_encoder_embed; KWK_EUNSUPPORTED when the model has no head, KWK_ERANGE also for a type id
 * outside the model's token types (of two or more). One thread at a time, as every call on an
 * encoder. */
KWK_API int kwk_encoder_classify(kwk_encoder *e, const int32_t *ids, const int32_t *types,
                                 const int32_t *offs, int n_seqs, float *out,
                                 struct kwk_err *err);

/* ---------------------------------------------------------------------------------------------
 * Chat templates (section owned by src/text/template)
 * ------------------------------------------------------------------------------------------- */

/* A compiled Jinja chat template, rendered the way transformers' apply_chat_template renders it
 * (jinja2 with trim_blocks, lstrip_blocks, loop controls, raise_exception, strftime_now and HF's
 * tojson). Templates are untrusted input: rendering is bounded by steps, depth, output and
 * memory limits, and every failure comes back as an error, never a crash. */
typedef struct kwk_template kwk_template;

enum kwk_template_dialect {
    KWK_TEMPLATE_JINJA2 = 0, /* Python jinja2 as transformers drives it (the default) */
    KWK_TEMPLATE_HFJS = 1,   /* huggingface.js @huggingface/jinja printing: lowercase booleans,
                                JSON-like lists and dicts, str + number concatenates */
};

struct kwk_template_opts {
    int trim_blocks;   /* drop the first newline after a block tag (default 1) */
    int lstrip_blocks; /* strip spaces before a block tag at line start (default 1) */
    int dialect;       /* enum kwk_template_dialect */
};

/* Defaults: trim_blocks = lstrip_blocks = 1, dialect jinja2. Thread-safe. */
KWK_API void kwk_template_opts_init(struct kwk_template_opts *o);

struct kwk_render_opts {
    int64_t now;         /* with have_now: the wall clock strftime_now reads, as seconds since
                            1970-01-01 of its broken-down UTC fields (timegm of the local time) */
    int have_now;        /* 0: strftime_now reads the system's local time */
    uint64_t max_steps;  /* evaluation steps; 0 = 5,000,000 */
    int max_depth;       /* macro calls and nested loops; 0 = 100 */
    size_t max_output;   /* bytes of output and of any string built; 0 = 16 MiB */
    size_t max_memory;   /* bytes of values one render may hold; 0 = 256 MiB */
};

/* All zero: the defaults above. Thread-safe. */
KWK_API void kwk_render_opts_init(struct kwk_render_opts *o);

/* Compile template text src[len] (UTF-8; opts may be NULL for transformers' defaults).
 * Returns NULL on failure with err filled: KWK_ESYNTAX with line and column (err->line,
 * err->col and the message), KWK_ELIMIT for an oversized or too deeply nested template.
 * Thread-safe (independent calls). The template does not keep src. */
KWK_API kwk_template *kwk_template_new(const char *src, size_t len,
                                       const struct kwk_template_opts *opts, struct kwk_err *err);
KWK_API void kwk_template_free(kwk_template *t);

/* Render with a context given as a JSON object (messages, tools, add_generation_prompt,
 * bos_token, ... : every key becomes a template variable; NULL or len 0 = no variables).
 * On success returns 0 and *out holds the NUL-terminated text (out_len bytes, may contain NUL
 * bytes from the context), freed with kwk_string_free. On failure *out is NULL and the code is
 * KWK_ERUNTIME (raise_exception: err->msg is exactly its message; or an evaluation error such as
 * an undefined attribute), KWK_ELIMIT (a limit in opts, named in the message), KWK_EFORMAT (bad
 * JSON) or KWK_EARG. Thread-safe: several threads may render one template at once. */
KWK_API int kwk_template_render(const kwk_template *t, const char *context_json, size_t len,
                                const struct kwk_render_opts *opts, char **out, size_t *out_len,
                                struct kwk_err *err);

/* Free a string returned by the library (NULL is fine). */
KWK_API void kwk_string_free(char *s);

#ifdef __cplusplus
}
#endif

#endif /* KWKER_H */
