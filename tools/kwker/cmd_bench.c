/* cmd_bench.c - kwker bench: prompt (pp) and generation (tg) tokens per second of one model,
 * medians over repetitions, as text or one JSON object (read by bench/side_by_side.py); for an
 * encoder, embeddings of -b sequences of -p tokens a call (pp only). Runs on the main thread;
 * the decoder's (encoder's) pool runs the kernels. */
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

struct bench_opts {
    const char *model;
    struct kwk_decoder_params params;
    struct cli_quant quant;
    int n_prompt, n_gen, reps, json;
    int n_seqs; /* encoders: sequences a call */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static const char *precision_name(int p)
{
    return p == KWK_PRECISION_PRESERVE ? "preserve" : p == KWK_PRECISION_BALANCED ? "balanced"
         : p == KWK_PRECISION_INT4 ? "int4" : "?";
}

/* s as a JSON string: a model path may hold quotes, backslashes or control bytes. */
static void put_json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

/* Peak resident memory of this process in KiB, -1 if unknown. VmHWM is the high-water mark of
 * this program's own address space; ru_maxrss (the fallback off Linux) also carries the parent's
 * resident size at fork across exec, which would charge a large parent's memory to us. */
static long peak_rss_kib(void)
{
    long kib = -1;
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) {
            kib = strtol(line + 6, NULL, 10);
            break;
        }
    if (f)
        fclose(f);
    struct rusage ru;
    if (kib < 0 && getrusage(RUSAGE_SELF, &ru) == 0)
        kib = ru.ru_maxrss;
    return kib;
}

static int parse(int argc, char **argv, struct bench_opts *o)
{
    kwk_decoder_params_init(&o->params);
    o->params.cache_dir = cli_cache_dir(NULL);
    o->n_prompt = 512;
    o->n_gen = 128;
    o->reps = 3;
    o->n_seqs = 1;
    cli_quant_init(&o->quant);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        int q = cli_quant_parse(&o->quant, a, v);
        if (q < 0) {
            fprintf(stderr, "kwker bench: bad or missing value for %s\n", a);
            return -1;
        }
        if (q > 0) {
            i += q - 1;
            continue;
        }
        if (!v)
            return -1;
        if (!strcmp(a, "--model") || !strcmp(a, "-m"))
            o->model = v;
        else if (!strcmp(a, "-p"))
            bad = cli_parse_int(v, 1, 1 << 20, &o->n_prompt);
        else if (!strcmp(a, "-n"))
            bad = cli_parse_int(v, 0, 1 << 20, &o->n_gen);
        else if (!strcmp(a, "-b"))
            bad = cli_parse_int(v, 1, 1 << 16, &o->n_seqs);
        else if (!strcmp(a, "-r"))
            bad = cli_parse_int(v, 1, 1000, &o->reps);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            bad = cli_parse_int(v, 1, 1024, &o->params.n_threads);
        else if (!strcmp(a, "--precision"))
            bad = (o->params.precision = cli_parse_precision(v)) < 0;
        else if (!strcmp(a, "--cache-dir"))
            o->params.cache_dir = cli_cache_dir(v);
        else
            return -1;
        if (bad)
            return -1;
        i++;
    }
    return o->model ? 0 : -1;
}

/* One repetition: a fresh cache, the prompt in one batched call, then n_gen single steps. */
static int run_once(kwk_decoder *d, const int32_t *ids, const struct bench_opts *o,
                    int n_vocab, double *pp_s, double *tg_s)
{
    kwk_decoder_truncate(d, 0);
    double t0 = now_s();
    int rc = kwk_decoder_eval(d, ids, o->n_prompt, NULL, KWK_LOGITS_LAST);
    double t1 = now_s();
    int32_t tok = ids[o->n_prompt - 1];
    for (int i = 0; rc == 0 && i < o->n_gen; i++) {
        tok = (tok * 7919 + 17) % n_vocab; /* fixed stream: speed does not depend on values */
        rc = kwk_decoder_eval(d, &tok, 1, NULL, KWK_LOGITS_LAST);
    }
    double t2 = now_s();
    *pp_s = t1 - t0;
    *tg_s = t2 - t1;
    return rc;
}

/* An encoder: -b sequences of -p tokens embedded in one call, medians over -r calls. */
static int bench_encoder(kwk_model *m, const struct bench_opts *o, double t_load)
{
    struct kwk_model_info info;
    kwk_model_get_info(m, &info);
    if ((int64_t)o->n_prompt * o->n_seqs > INT32_MAX) {
        fprintf(stderr, "kwker bench: -p %d x -b %d tokens is more than one call takes\n",
                o->n_prompt, o->n_seqs);
        return 1;
    }
    if (o->quant.mix_bits || o->quant.calib_file || o->quant.gptq || o->quant.kv_bits) {
        fprintf(stderr, "kwker bench: --mix-bits, --calib, --gptq and --kv-bits apply to "
                        "decoders; this model is an encoder\n");
        return 1;
    }
    if (o->n_prompt > info.max_position) {
        fprintf(stderr, "kwker bench: -p %d: the encoder takes at most %d tokens a sequence\n",
                o->n_prompt, info.max_position);
        return 1;
    }
    struct kwk_encoder_params ep;
    kwk_encoder_params_init(&ep);
    ep.n_threads = o->params.n_threads;
    ep.precision = o->params.precision;
    ep.act_bits = o->quant.act_bits;
    struct kwk_err err = {0};
    double t_enc = now_s();
    kwk_encoder *e = kwk_encoder_new(m, &ep, &err);
    t_enc = now_s() - t_enc;
    size_t n_ids = (size_t)o->n_prompt * (size_t)o->n_seqs;
    int32_t *ids = malloc(sizeof(int32_t) * n_ids);
    int32_t *offs = malloc(sizeof(int32_t) * ((size_t)o->n_seqs + 1));
    float *out = malloc(sizeof(float) * (size_t)o->n_seqs * (size_t)info.d_model);
    double *pp = calloc((size_t)o->reps, sizeof(double));
    int rc = 1;
    if (!e || !ids || !offs || !out || !pp) {
        fprintf(stderr, "kwker bench: %s\n", e ? "out of memory" : err.msg);
        goto out;
    }
    for (size_t i = 0; i < n_ids; i++)
        ids[i] = (int32_t)(((uint32_t)i * 2654435761u) % (uint32_t)info.n_vocab);
    for (int s = 0; s <= o->n_seqs; s++)
        offs[s] = s * o->n_prompt;
    for (int r = -1; r < o->reps; r++) { /* r = -1: an untimed pass pages the weights in */
        double t0 = now_s();
        if (kwk_encoder_embed(e, ids, offs, o->n_seqs, out, &err)) {
            fprintf(stderr, "kwker bench: %s\n", err.msg);
            goto out;
        }
        if (r >= 0)
            pp[r] = now_s() - t0;
    }
    double t = median(pp, o->reps), pp_tps = (double)n_ids / t;
    int threads = ep.n_threads ? ep.n_threads : kwk_default_threads();
    int act_bits = ep.precision == KWK_PRECISION_PRESERVE ? 32 : ep.act_bits ? ep.act_bits : 16;
    long rss = peak_rss_kib();
    if (o->json) {
        printf("{\"model\": ");
        put_json_str(o->model);
        printf(", \"arch\": ");
        put_json_str(info.arch_name);
        printf(", \"encoder\": true, \"n_params\": %lld, \"precision\": %d, "
               "\"precision_name\": \"%s\", \"isa\": \"%s\", \"threads\": %d, "
               "\"n_prompt\": %d, \"n_seqs\": %d, \"reps\": %d, \"load_s\": %.3f, "
               "\"encoder_s\": %.3f, \"pp_tps\": %.2f, \"embed_per_s\": %.2f, "
               "\"tg_tps\": null, \"peak_rss_kib\": %ld, \"act_bits\": %d}\n",
               (long long)info.n_params, ep.precision, precision_name(ep.precision),
               kwk_isa_name(kwk_isa()), threads, o->n_prompt, o->n_seqs, o->reps, t_load,
               t_enc, pp_tps, o->n_seqs / t, rss, act_bits);
    } else {
        printf("model %s (%s encoder, %.1fM params), precision %s (%d-bit activations), isa "
               "%s, %d threads, load %.2f s, encoder %.2f s\n"
               "pp%d x %d sequences: %.2f tokens/s, %.2f embeddings/s   (medians of %d)\n"
               "peak resident memory: %.1f MiB\n",
               o->model, info.arch_name, info.n_params / 1e6, precision_name(ep.precision),
               act_bits, kwk_isa_name(kwk_isa()), threads, t_load, t_enc, o->n_prompt,
               o->n_seqs, pp_tps, o->n_seqs / t, o->reps, rss / 1024.0);
    }
    rc = 0;
out:
    kwk_encoder_free(e);
    free(ids);
    free(offs);
    free(out);
    free(pp);
    return rc;
}

int cmd_bench(int argc, char **argv)
{
    struct bench_opts o = {0};
    if (parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: kwker bench --model M [--precision P] [-p 512] [-n 128] [-t N] "
                        "[-r 3] [--json] [--cache-dir DIR|off]\n"
                        "       (an encoder: -b N sequences of -p tokens a call; -n unused)\n"
                        CLI_QUANT_USAGE);
        return 2;
    }
    o.params.max_cache_len = o.n_prompt + o.n_gen;
    int rc = 1;
    struct kwk_err err = {0};
    kwk_decoder *d = NULL;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)o.n_prompt);
    double *pp = calloc((size_t)o.reps, sizeof(double));
    double *tg = calloc((size_t)o.reps, sizeof(double));
    double t_load = now_s();
    kwk_model *m = kwk_model_load(o.model, &err);
    t_load = now_s() - t_load;
    if (!m || !ids || !pp || !tg) {
        fprintf(stderr, "kwker bench: %s\n", m ? "out of memory" : err.msg);
        goto out;
    }
    if (cli_quant_load(&o.quant, o.model, "bench"))
        goto out;
    struct kwk_model_info minfo;
    kwk_model_get_info(m, &minfo);
    if (minfo.is_encoder) {
        rc = bench_encoder(m, &o, t_load);
        goto out;
    }
    o.params.mix_bits = o.quant.mix_bits;
    o.params.calib = o.quant.ids;
    o.params.n_calib = (int64_t)o.quant.n_ids;
    o.params.gptq = o.quant.gptq;
    o.params.act_bits = o.quant.act_bits;
    o.params.kv_bits = o.quant.kv_bits;
    /* ready to compute: packing (or mapping a cached pack), the KV cache, the threads */
    double t_decoder = now_s();
    d = kwk_decoder_new(m, &o.params, &err);
    t_decoder = now_s() - t_decoder;
    if (!d) {
        fprintf(stderr, "kwker bench: %s\n", err.msg);
        goto out;
    }
    struct kwk_model_info info;
    kwk_model_get_info(m, &info);
    for (int i = 0; i < o.n_prompt; i++)
        ids[i] = (int32_t)(((uint32_t)i * 2654435761u) % (uint32_t)info.n_vocab);
    double warm_pp, warm_tg; /* one untimed pass pages the weights in */
    if (run_once(d, ids, &o, info.n_vocab, &warm_pp, &warm_tg) != 0)
        goto out;
    for (int r = 0; r < o.reps; r++)
        if (run_once(d, ids, &o, info.n_vocab, &pp[r], &tg[r]) != 0)
            goto out;
    double pp_tps = o.n_prompt / median(pp, o.reps);
    double tg_tps = o.n_gen ? o.n_gen / median(tg, o.reps) : 0.0;
    int threads = o.params.n_threads ? o.params.n_threads : kwk_default_threads();
    const char *isa = kwk_isa_name(kwk_isa());
    long rss = peak_rss_kib();
    /* the activations' width the matmuls ran with: preserve's are float32 */
    int act_bits = o.params.precision == KWK_PRECISION_PRESERVE ? 32
                   : o.params.act_bits                          ? o.params.act_bits
                                                                : 16;
    if (o.json) {
        printf("{\"model\": ");
        put_json_str(o.model);
        printf(", \"arch\": ");
        put_json_str(info.arch_name);
        printf(", \"n_params\": %lld, \"precision\": %d, \"precision_name\": \"%s\", "
               "\"isa\": \"%s\", \"threads\": %d, \"n_prompt\": %d, \"n_gen\": %d, "
               "\"reps\": %d, \"load_s\": %.3f, \"decoder_s\": %.3f, \"pp_tps\": %.2f, "
               "\"tg_tps\": %.2f, "
               "\"peak_rss_kib\": %ld, \"bits_per_weight\": %.4f, \"act_bits\": %d, "
               "\"kv_bits\": %d, \"attn\": \"%s\", \"matmul\": \"%s\"}\n",
               (long long)info.n_params, o.params.precision, precision_name(o.params.precision),
               isa, threads, o.n_prompt, o.n_gen, o.reps, t_load, t_decoder, pp_tps, tg_tps, rss,
               kwk_decoder_bits_per_weight(d), act_bits, kwk_decoder_kv_bits(d),
               kwk_decoder_attn_name(d), kwk_decoder_matmul_name(d));
    } else {
        printf("model %s (%s, %.1fM params), precision %s (%.3f bits per weight, %d-bit "
               "activations, %d-bit KV cache), isa %s (prompt products %s, attention %s), "
               "%d threads, load %.2f s, decoder %.2f s\n"
               "pp%d: %.2f tokens/s\ntg%d: %.2f tokens/s   (medians of %d)\n"
               "peak resident memory: %.1f MiB\n",
               o.model, info.arch_name, info.n_params / 1e6, precision_name(o.params.precision),
               kwk_decoder_bits_per_weight(d), act_bits, kwk_decoder_kv_bits(d), isa,
               kwk_decoder_matmul_name(d), kwk_decoder_attn_name(d), threads, t_load, t_decoder,
               o.n_prompt, pp_tps, o.n_gen, tg_tps, o.reps, rss / 1024.0);
    }
    rc = 0;
out:
    kwk_decoder_free(d);
    kwk_model_free(m);
    cli_quant_free(&o.quant);
    free(ids);
    free(pp);
    free(tg);
    return rc;
}
