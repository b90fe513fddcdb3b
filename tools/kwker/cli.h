/* cli.h - the kwker command-line program: one function per subcommand, one file each. */
#ifndef KWK_CLI_H
#define KWK_CLI_H

#include "kwker.h"

/* Each subcommand gets argv with argv[0] = subcommand name; returns the process exit code. */
int cmd_generate(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_embed(int argc, char **argv);
int cmd_rerank(int argc, char **argv);

/* Parse a comma-separated id list into ids[cap]; returns the count or -1 on a bad list. */
int cli_parse_ids(const char *s, int *ids, int cap);

/* Parse an integer in [lo, hi]; -1 when s is not one. */
int cli_parse_int(const char *s, int lo, int hi, int *out);
/* enum kwk_precision for "preserve" | "balanced" | "int8" | "int4", or -1. */
int cli_parse_precision(const char *s);
/* enum kwk_pooling for "mean" | "cls" | "last" | "max" | "mean_sqrt_len", or -1. */
int cli_parse_pooling(const char *s);
#define CLI_POOLING_USAGE \
    "  --pooling P              embedding models: mean | cls | last | max | mean_sqrt_len\n" \
    "                           (default: the model's, from its sentence-transformers files)\n" \
    "  --normalize, --no-normalize  embedding models: scale embeddings to unit length or not\n" \
    "                           (default: the model's)\n"

/* An encoder command's options (kwker embed, kwker rerank): --model, --precision, --act-bits,
 * -t / --threads and, for embeddings, --pooling. a is the option, v its value (NULL when a is
 * last). Returns 0 when taken (*model or p set), 1 when a is not one of them, -1 on a bad or
 * missing value. */
int cli_encoder_opt(const char *a, const char *v, int pooling, const char **model,
                    struct kwk_encoder_params *p);
#define CLI_ENCODER_USAGE \
    "  -m, --model M            model folder, .gguf file or Hugging Face id in the\n" \
    "                           local cache\n"
#define CLI_ENCODER_PRECISION_USAGE \
    "  --precision P            preserve (default) | balanced | int8 | int4\n" \
    "  --act-bits N             balanced / int4 activations: 16 (default) or 8\n" \
    "  -t, --threads N          compute threads (default: the cores)\n"

/* Tokenizer, model and encoder of path for command cmd ("embed"), which wants what ("an
 * embedding model"): 0 with all three and *info, or -1 after printing "kwker <cmd>: <path>:
 * <why>" (each already freed then). */
int cli_encoder_load(const char *cmd, const char *what, const char *path,
                     const struct kwk_encoder_params *p, kwk_tokenizer **tok, kwk_model **m,
                     kwk_encoder **enc, struct kwk_model_info *info);

/* The packed-weight cache directory for --cache-dir v (NULL when the option is absent): "off"
 * means none (NULL); absent, $KWKER_CACHE ("" or "off": none) or else ~/.cache/kwker/packs.
 * The cache only matters for --precision balanced / int8 / int4. */
const char *cli_cache_dir(const char *v);

/* Largest chat template file read (kwker template's .jinja, --chat-template-file). */
#define CLI_TEMPLATE_FILE_MAX ((size_t)64 << 20)
#define CLI_TEMPLATE_FILE_USAGE \
    "  --chat-template-file F   a Jinja chat template to use instead of the model's (for files\n" \
    "                           without one, as many GGUF files)\n" \
    "  --chat-template-kwargs J variables for the chat template, a JSON object (as\n" \
    "                           apply_chat_template(**kwargs), e.g. '{\"enable_thinking\":\n" \
    "                           false}'; serve: a request's chat_template_kwargs win)\n"

/* --chat-template-kwargs' text parsed into *out (a JSON object that sets none of the
 * conversation's own variables: srv_template_kwargs_check). Returns 0, or -1 after printing the
 * error. */
struct json_t;
int cli_template_kwargs(const char *text, const char *cmd, struct json_t **out);

/* The chat template to use, compiled: the one in file (--chat-template-file: llama.cpp's option,
 * for model files that carry none, as many GGUF files, or a wrong one) when file is not NULL,
 * else the tokenizer's. Returns 0 with *tpl set (NULL: the model has none and no file was
 * given), or -1 after printing "kwker <cmd>: ..." (a file that cannot be read, a template that
 * does not compile). With source not NULL, *source is a copy of the template's text (NULL when
 * there is none; free with kwk_free). */
int cli_chat_template(const kwk_tokenizer *tok, const char *file, const char *cmd,
                      kwk_template **tpl, char **source);

/* How balanced / int4 weights are fitted: --mix-bits, --calib, --calib-tokens, --gptq; how they
 * are read: --act-bits; and the KV cache's element: --kv-bits (the same on generate, chat, bench,
 * perplexity and serve). */
struct cli_quant {
    int mix_bits;           /* 0 = by model size */
    int gptq;
    int act_bits;           /* 8 or 16; 0 = the library's default (16) */
    int kv_bits;            /* 16 or 32; 0 = the library's default (by precision) */
    const char *calib_file; /* text whose tokens calibrate, or NULL */
    int calib_tokens;       /* at most this many of its tokens */
    int32_t *ids;           /* after cli_quant_load: the calibration ids (library-allocated) */
    size_t n_ids;
};
#define CLI_QUANT_USAGE                                                                            \
    "  --mix-bits N             int4: bits of the matrices kept wider: 8, 6, 4 (none);\n"          \
    "                           default 6 from 1B parameters, 8 below\n"                           \
    "  --calib FILE             fit the packed weights to the model's activations on this\n"       \
    "                           text (activation-aware scales; part of the pack cache key)\n"      \
    "  --calib-tokens N         use its first N tokens (default 4096)\n"                           \
    "  --gptq                   GPTQ on top of --calib\n"                                          \
    "  --act-bits N             balanced/int4 activations: 16 (default, two int8 passes) or\n"     \
    "                           8 (one pass as llama.cpp: faster prompts, slightly higher\n"       \
    "                           perplexity; the same packed weights and cache)\n"                  \
    "  --kv-bits N              KV cache: 16 (half; default for balanced/int4) or 32 (float;\n"    \
    "                           default for preserve, transformers' numbers)\n"

void cli_quant_init(struct cli_quant *q);
/* Option a with its value v (NULL when none follows). Returns 2 when a and v were consumed, 1
 * when a alone, 0 when a is not one of these, -1 on a bad or missing value. */
int cli_quant_parse(struct cli_quant *q, const char *a, const char *v);
/* After parsing: tokenize the calibration text with the model's tokenizer. 0, or -1 after
 * printing "kwker <cmd>: ..." to stderr. */
int cli_quant_load(struct cli_quant *q, const char *model, const char *cmd);
void cli_quant_free(struct cli_quant *q);

#endif
