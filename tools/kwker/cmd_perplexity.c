/* cmd_perplexity.c - kwker perplexity: the perplexity of a model on a text file with llama.cpp's
 * protocol (llama-perplexity's default mode), so that the numbers compare with llama.cpp's own.
 * Single-threaded driver over one decoder (the decoder's pool does the compute).
 *
 * The protocol: the whole file is tokenized once (one trailing '\n' dropped, as llama.cpp's -f
 * does; BOS in front when the vocabulary adds one), cut into chunks of ctx tokens, and each chunk
 * is evaluated from an empty cache with its first token replaced by BOS (when the vocabulary adds
 * one). Only the second half is scored: the logits at positions ctx/2 .. ctx-2 predict the tokens
 * after them, so every scored token has at least ctx/2 tokens of context. The negative
 * log-likelihoods are summed in double; PPL = exp(mean) and its standard error is
 * PPL * sqrt(var(nll) / (count - 1)), the figure llama.cpp prints after "+/-". */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "cli.h"
#include "kwker.h"

#define PPL_FILE_LIMIT ((size_t)1 << 30)

struct ppl_opts {
    const char *model;
    const char *file;
    struct kwk_decoder_params params;
    struct cli_quant quant;
    int n_chunks; /* 0: every whole chunk of the file */
    int ctx;
};

/* Running sums over every scored token. */
struct ppl_acc {
    double nll;  /* sum of -log p(token) */
    double nll2; /* sum of its squares */
    int64_t count;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *precision_name(int p)
{
    static const char *const names[] = {"preserve", "balanced", "int4"};
    return p >= 0 && p < 3 ? names[p] : "?";
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kwker perplexity --model M --file TEXT [--precision "
               "preserve|balanced|int8|int4] [--chunks 20] [--ctx 512] [-t N]\n"
               "       [--cache-dir DIR|off] [--mix-bits N] [--calib FILE] [--calib-tokens N]"
               " [--gptq]\n"
               "       [--act-bits 8|16] [--kv-bits 16|32]\n"
               "  llama.cpp's protocol: chunks of --ctx tokens, each scored on its second half;\n"
               "  --chunks 0 scores every whole chunk of the file.\n");
}

static int parse(int argc, char **argv, struct ppl_opts *o)
{
    kwk_decoder_params_init(&o->params);
    o->params.cache_dir = cli_cache_dir(NULL);
    o->n_chunks = 20;
    o->ctx = 512;
    cli_quant_init(&o->quant);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        int q = cli_quant_parse(&o->quant, a, v);
        if (q < 0) {
            fprintf(stderr, "kwker perplexity: bad or missing value for %s\n", a);
            return -1;
        }
        if (q > 0) {
            i += q - 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "kwker perplexity: %s needs a value or is unknown\n", a);
            return -1;
        }
        if (!strcmp(a, "--model") || !strcmp(a, "-m"))
            o->model = v;
        else if (!strcmp(a, "--file") || !strcmp(a, "-f"))
            o->file = v;
        else if (!strcmp(a, "--chunks"))
            bad = cli_parse_int(v, 0, 1 << 24, &o->n_chunks);
        else if (!strcmp(a, "--ctx") || !strcmp(a, "-c"))
            bad = cli_parse_int(v, 4, 1 << 20, &o->ctx);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            bad = cli_parse_int(v, 1, 1024, &o->params.n_threads);
        else if (!strcmp(a, "--precision") || !strcmp(a, "--weights"))
            bad = (o->params.precision = cli_parse_precision(v)) < 0;
        else if (!strcmp(a, "--cache-dir"))
            o->params.cache_dir = cli_cache_dir(v);
        else {
            fprintf(stderr, "kwker perplexity: unknown option '%s'\n", a);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "kwker perplexity: bad value '%s' for %s\n", v, a);
            return -1;
        }
        i++;
    }
    if (!o->model || !o->file) {
        fprintf(stderr, "kwker perplexity: --model and --file are required\n");
        return -1;
    }
    return 0;
}

/* Whether encoding with add_special puts BOS in front (llama.cpp's add_bos of the vocabulary):
 * probed on a one-letter text so that tokens the post-processor appends do not matter. */
static int vocab_adds_bos(const kwk_tokenizer *t)
{
    int32_t with[16], without[16];
    size_t n_with = 0, n_without = 0;
    int32_t bos = kwk_tokenizer_bos_id(t);
    if (bos < 0)
        return 0;
    if (kwk_tokenizer_encode(t, "a", 1, 1, with, 16, &n_with) != 0 ||
        kwk_tokenizer_encode(t, "a", 1, 0, without, 16, &n_without) != 0)
        return 0;
    return n_with > n_without && with[0] == bos;
}

/* The token stream of the file: text as-is (one trailing '\n' dropped) without special tokens,
 * BOS in front when the vocabulary adds it. *ids is heap memory (free()). */
static int tokenize_file(const struct ppl_opts *o, const kwk_tokenizer *t, int add_bos,
                         int32_t **ids, size_t *n_ids, struct kwk_err *err)
{
    char *text = NULL;
    size_t len = 0, n = 0;
    int32_t *raw = NULL;
    *ids = NULL;
    int rc = kwk_read_file(o->file, PPL_FILE_LIMIT, &text, &len, err);
    if (rc != 0)
        return rc;
    if (len > 0 && text[len - 1] == '\n')
        len--;
    rc = kwk_tokenizer_encode_alloc(t, text, len, 0, &raw, &n);
    if (rc != 0) {
        kwk_err_set(err, rc, "%s: tokenizing failed (%s)", o->file, kwk_status_str(rc));
        goto out_text;
    }
    size_t total = n + (add_bos ? 1 : 0); /* n ids already fit in memory: no overflow */
    *ids = malloc((total ? total : 1) * sizeof(int32_t));
    if (!*ids) {
        rc = kwk_err_set(err, -ENOMEM, "out of memory for %zu tokens", total);
        goto out_raw;
    }
    if (add_bos)
        (*ids)[0] = kwk_tokenizer_bos_id(t);
    if (n)
        memcpy(*ids + (add_bos ? 1 : 0), raw, n * sizeof(int32_t));
    *n_ids = total;
out_raw:
    kwk_tokenizer_mem_free(raw);
out_text:
    kwk_free(text);
    return rc;
}

/* -log softmax(row)[tok], the max taken in float and the rest in double so that a vocabulary of
 * 150k logits sums without loss. */
static double token_nll(const float *row, int n_vocab, int32_t tok)
{
    float mx = row[0];
    for (int i = 1; i < n_vocab; i++)
        mx = row[i] > mx ? row[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++)
        sum += exp((double)row[i] - (double)mx);
    return -((double)row[tok] - (double)mx - log(sum));
}

/* Evaluate chunk c (tokens[c*ctx .. c*ctx+ctx)) from an empty cache and add its second half
 * to acc. chunk[] and logits[] are scratch of ctx and ctx*n_vocab entries. */
static int score_chunk(kwk_decoder *d, const int32_t *tokens, int c, int ctx, int add_bos,
                       int32_t bos, int n_vocab, int32_t *chunk, float *logits,
                       struct ppl_acc *acc)
{
    const int32_t *src = tokens + (size_t)c * (size_t)ctx;
    memcpy(chunk, src, (size_t)ctx * sizeof(int32_t));
    if (add_bos)
        chunk[0] = bos;
    int rc = kwk_decoder_truncate(d, 0);
    if (rc == 0)
        rc = kwk_decoder_eval(d, chunk, ctx, logits, KWK_LOGITS_ALL);
    if (rc != 0)
        return rc;
    for (int j = ctx / 2; j < ctx - 1; j++) {
        int32_t next = src[j + 1];
        if (next < 0 || next >= n_vocab)
            return KWK_ERANGE;
        double v = token_nll(logits + (size_t)j * (size_t)n_vocab, n_vocab, next);
        acc->nll += v;
        acc->nll2 += v * v;
        acc->count++;
    }
    return 0;
}

/* Print the final estimate; returns 0, or 1 when the variance is not positive (as llama.cpp,
 * which then prints no error bar). */
static int print_final(const struct ppl_acc *acc, int n_chunks, int ctx)
{
    double mean = acc->nll / (double)acc->count;
    double var = acc->nll2 / (double)acc->count - mean * mean;
    double ppl = exp(mean);
    printf("\n");
    if (var > 0 && acc->count > 1) {
        double se = sqrt(var / (double)(acc->count - 1)) * ppl;
        printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, se);
    } else {
        printf("Final estimate: PPL = %.4f +/- nan\n", ppl);
    }
    printf("nll_mean = %.10f, ppl = %.10g, scored tokens = %lld, chunks = %d, ctx = %d\n", mean,
           ppl, (long long)acc->count, n_chunks, ctx);
    return var > 0 ? 0 : 1;
}

int cmd_perplexity(int argc, char **argv)
{
    struct ppl_opts o = {0};
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (parse(argc, argv, &o) != 0) {
        usage(stderr);
        return 2;
    }
    int rc = 1;
    struct kwk_err err = {0};
    kwk_tokenizer *tok = NULL;
    kwk_model *m = NULL;
    kwk_decoder *d = NULL;
    int32_t *tokens = NULL, *chunk = NULL;
    float *logits = NULL;
    size_t n_tokens = 0;
    struct ppl_acc acc = {0};

    tok = kwk_tokenizer_load(o.model, &err);
    if (!tok) {
        fprintf(stderr, "kwker perplexity: tokenizer: %s\n", err.msg);
        goto out;
    }
    int add_bos = vocab_adds_bos(tok);
    int32_t bos = kwk_tokenizer_bos_id(tok);
    double t0 = now_s();
    if (tokenize_file(&o, tok, add_bos, &tokens, &n_tokens, &err) != 0) {
        fprintf(stderr, "kwker perplexity: %s\n", err.msg);
        goto out;
    }
    fprintf(stderr, "perplexity: %zu tokens (BOS %s) in %.2f s\n", n_tokens,
            add_bos ? "added" : "not added", now_s() - t0);
    if (n_tokens < 2 * (size_t)o.ctx) {
        fprintf(stderr, "kwker perplexity: %s tokenizes to %zu tokens; a context of %d needs at "
                        "least %d\n", o.file, n_tokens, o.ctx, 2 * o.ctx);
        goto out;
    }
    int n_chunk_max = (int)(n_tokens / (size_t)o.ctx < (size_t)1 << 24 ? n_tokens / (size_t)o.ctx
                                                                         : (size_t)1 << 24);
    int n_chunks = o.n_chunks == 0 || o.n_chunks > n_chunk_max ? n_chunk_max : o.n_chunks;

    m = kwk_model_load(o.model, &err);
    if (!m) {
        fprintf(stderr, "kwker perplexity: %s\n", err.msg);
        goto out;
    }
    struct kwk_model_info info;
    kwk_model_get_info(m, &info);
    o.params.max_cache_len = o.ctx;
    if (cli_quant_load(&o.quant, o.model, "perplexity"))
        goto out;
    o.params.mix_bits = o.quant.mix_bits;
    o.params.calib = o.quant.ids;
    o.params.n_calib = (int64_t)o.quant.n_ids;
    o.params.gptq = o.quant.gptq;
    o.params.act_bits = o.quant.act_bits;
    o.params.kv_bits = o.quant.kv_bits;
    d = kwk_decoder_new(m, &o.params, &err);
    if (!d) {
        fprintf(stderr, "kwker perplexity: %s\n", err.msg);
        goto out;
    }
    size_t n_logits = (size_t)o.ctx * (size_t)info.n_vocab;
    if (info.n_vocab <= 0 || n_logits / (size_t)o.ctx != (size_t)info.n_vocab ||
        n_logits > SIZE_MAX / sizeof(float)) {
        fprintf(stderr, "kwker perplexity: logits of %d x %d do not fit in memory\n", o.ctx,
                info.n_vocab);
        goto out;
    }
    logits = malloc(n_logits * sizeof(float));
    chunk = malloc((size_t)o.ctx * sizeof(int32_t));
    if (!logits || !chunk) {
        fprintf(stderr, "kwker perplexity: out of memory for %zu logits\n", n_logits);
        goto out;
    }
    int n_threads = o.params.n_threads ? o.params.n_threads : kwk_default_threads();
    fprintf(stderr, "perplexity: %d chunks of %d tokens (of %d in the file), precision %s, "
                    "isa %s, %d threads\n", n_chunks, o.ctx, n_chunk_max,
            precision_name(o.params.precision), kwk_isa_name(kwk_isa()), n_threads);
    for (int c = 0; c < n_chunks; c++) {
        double tc = now_s();
        int e = score_chunk(d, tokens, c, o.ctx, add_bos, bos, info.n_vocab, chunk, logits, &acc);
        if (e != 0) {
            fprintf(stderr, "\nkwker perplexity: chunk %d: %s\n", c + 1, kwk_status_str(e));
            goto out;
        }
        if (c == 0)
            fprintf(stderr, "perplexity: %.2f seconds per pass - ETA %.2f minutes\n",
                    now_s() - tc, (now_s() - tc) * n_chunks / 60.0);
        printf("[%d]%.4f,", c + 1, exp(acc.nll / (double)acc.count));
        fflush(stdout);
    }
    rc = print_final(&acc, n_chunks, o.ctx);
out:
    free(logits);
    free(chunk);
    free(tokens);
    kwk_decoder_free(d);
    kwk_model_free(m);
    kwk_tokenizer_free(tok);
    cli_quant_free(&o.quant);
    return rc;
}
