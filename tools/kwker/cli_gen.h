/* cli_gen.h - what `kwker generate` and `kwker chat` share: generation options (llama-cli
 * spellings where they overlap), loading the model / draft / tokenizer, one streamed generation,
 * the --stats line, and the chat conversation rendered with the model's template.
 * Main thread only. */
#ifndef KWK_CLI_GEN_H
#define KWK_CLI_GEN_H

#include <signal.h>
#include <stdio.h>

#include "cli.h"
#include "kwker.h"

struct cli_gen_opts {
    const char *model;
    const char *draft;          /* --draft M2, or NULL */
    const char *system;         /* --system text, or NULL */
    const char *chat_template_file; /* --chat-template-file F, or NULL: the model's template */
    const char *chat_template_kwargs; /* --chat-template-kwargs JSON, or NULL */
    struct kwk_decoder_params dec;
    struct cli_quant quant;     /* --mix-bits, --calib, --gptq, --act-bits (into dec) */
    struct kwk_sampler_params smp;
    double temperature;         /* -1 until --temperature is given */
    int top_k;                  /* -1 until given */
    double top_p, min_p;        /* -1 until given */
    int seed_given;
    int n_predict;              /* new tokens a reply may have; -1: until eos or a full cache */
    int lookup;                 /* n-gram lookup candidates a step (0 off) */
    int n_draft;                /* tokens the draft proposes a step */
    int stats;                  /* print the --stats line to stderr */
    const char **stop;          /* [n_stop] pointers into argv (the array is heap) */
    int n_stop;
    /* constrained decoding (llama-cli's options): one of them, compiled by cli_gen_finish */
    const char *grammar, *grammar_file, *json_schema, *json_schema_file;
    kwk_grammar *compiled;
};

/* Defaults: greedy, -n n_predict, lookup 8, no draft, default threads and cache. */
void cli_gen_opts_init(struct cli_gen_opts *o, int n_predict);
void cli_gen_opts_free(struct cli_gen_opts *o);

enum { CLI_OPT_NONE = 0, CLI_OPT_OK = 1, CLI_OPT_BAD = -1 };

/* Consume the generation option at argv[*i] (and its value, advancing *i). Returns CLI_OPT_OK,
 * CLI_OPT_NONE when argv[*i] is not a generation option, or CLI_OPT_BAD after printing
 * "kwker <cmd>: ..." to stderr (a bad or missing value). */
int cli_gen_parse(struct cli_gen_opts *o, const char *cmd, int argc, char **argv, int *i);

/* Settle the sampling parameters once every option is read: sampling only when --temperature
 * is > 0 (with llama-cli's defaults top-k 40, top-p 0.95, min-p 0.05 for those not given), a
 * random seed unless --seed was given; compile the grammar or JSON schema given. Returns 0 or -1
 * after printing why. */
int cli_gen_finish(struct cli_gen_opts *o, const char *cmd);

/* Usage lines of the options above. */
void cli_gen_usage(FILE *f);

/* A loaded model (and draft) with its decoder(s) and, when asked for, its tokenizer. */
struct cli_session {
    kwk_model *m, *dm;
    kwk_decoder *d, *dd;
    kwk_tokenizer *tok;
    int32_t eos[8];
    int n_eos;
    kwk_grammar_vocab *gvocab;  /* tok's token bytes, built at the first constrained reply */
    int cache_len;              /* positions of d's KV cache */
};

/* Load o->model (and o->draft), create the decoders with SIGINT blocked in their worker
 * threads, and the tokenizer when need_tok. Returns 0 or -1 after printing the error. */
int cli_session_open(struct cli_session *s, const struct cli_gen_opts *o, int need_tok,
                     const char *cmd);
void cli_session_close(struct cli_session *s);

/* One generation's timing, measured around kwk_generate. */
struct cli_timing {
    double t_start, t_first, t_end; /* seconds (monotonic); t_first 0 when no token came */
};

/* What the token callback does: stream text (or ids) to stdout, flushed, and stop when
 * *cancel becomes non-zero (a signal handler's flag; may be NULL). */
struct cli_stream {
    int print_text;             /* 1: write each text piece; 0: write ids "a,b,c" */
    int n_printed;              /* ids printed so far (for the commas) */
    volatile sig_atomic_t *cancel;
    struct cli_timing *timing;
};

/* Generate up to max_new tokens after ids[n] with the session's decoder, streaming as st says.
 * out is cleared first and owns its buffers after the call (free with cli_output_free).
 * Returns 0 or -1 after printing the error. */
int cli_generate(struct cli_session *s, const struct cli_gen_opts *o, const int32_t *ids, int n,
                 int max_new, struct cli_stream *st, struct kwk_gen_output *out,
                 const char *cmd);
void cli_output_free(struct kwk_gen_output *out);

/* The --stats line for one generation, to f. */
void cli_print_stats(FILE *f, const struct kwk_gen_output *out, const struct cli_timing *t,
                     const struct cli_gen_opts *o);

/* A conversation rendered with the model's chat template, as transformers'
 * apply_chat_template(messages, add_generation_prompt=True, tokenize=True) does. */
struct cli_conv {
    kwk_template *tpl;
    const char *bos, *eos;      /* the tokenizer's, borrowed */
    void *messages;             /* json_t array of {role, content} */
    void *kwargs;               /* json_t object: --chat-template-kwargs, or NULL */
};

/* Compile the chat template (cli_chat_template; a model without one is an error here). Returns 0
 * or -1 after printing the error. */
int cli_conv_init(struct cli_conv *c, const kwk_tokenizer *tok, const char *file,
                  const char *kwargs, const char *cmd);
void cli_conv_free(struct cli_conv *c);
/* Append a message; 0, or -1 (content not valid UTF-8, or out of memory). */
int cli_conv_add(struct cli_conv *c, const char *role, const char *content);
/* Messages in the conversation. */
int cli_conv_len(const struct cli_conv *c);
/* Remove the last message; or keep the first `keep` and drop the rest. */
void cli_conv_pop(struct cli_conv *c);
void cli_conv_truncate(struct cli_conv *c, int keep);
/* Drop the oldest exchange after the first `keep` messages: the messages up to (not including)
 * the second user message after them. Returns 1 when something was dropped. */
int cli_conv_drop_oldest(struct cli_conv *c, int keep);
/* Render with add_generation_prompt and encode without added special tokens (the template puts
 * them); *ids is freed with kwk_tokenizer_mem_free. Returns 0 or -1 after printing the error. */
int cli_conv_ids(const struct cli_conv *c, const kwk_tokenizer *tok, int32_t **ids, size_t *n,
                 const char *cmd);

#endif
