/* cli_gen.c - generation options, model/tokenizer loading, one streamed generation and the
 * --stats line, shared by `kwker generate` and `kwker chat`. Main thread only. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "cli.h"
#include "cli_gen.h"

void cli_gen_opts_init(struct cli_gen_opts *o, int n_predict)
{
    memset(o, 0, sizeof *o);
    cli_quant_init(&o->quant);
    kwk_decoder_params_init(&o->dec);
    o->dec.cache_dir = cli_cache_dir(NULL);
    kwk_sampler_params_init(&o->smp);
    o->temperature = -1;
    o->top_k = -1;
    o->top_p = -1;
    o->min_p = -1;
    o->n_predict = n_predict;
    o->lookup = 8;
    o->n_draft = 4;
}

void cli_gen_opts_free(struct cli_gen_opts *o)
{
    cli_quant_free(&o->quant);
    free(o->stop);
    o->stop = NULL;
    o->n_stop = 0;
    kwk_grammar_free(o->compiled);
    o->compiled = NULL;
}

void cli_gen_usage(FILE *f)
{
    fprintf(f,
            "generation options (llama-cli spellings accepted where they overlap):\n"
            "  -m, --model M            a .gguf file, a folder with config.json + safetensors,\n"
            "                           or a Hugging Face id in the local cache\n"
            "  -n, --n-predict N        most new tokens (-1: until eos or the cache is full)\n"
            "  --temperature, --temp T  > 0 samples (top-k 40, top-p 0.95, min-p 0.05 unless\n"
            "                           given, as llama-cli); 0 or absent: greedy\n"
            "  --top-k K                0 off        --top-p P    1 off      --min-p P  0 off\n"
            "  --repeat-penalty R       1 off (applies to every prompt and output token)\n"
            "  --presence-penalty X, --frequency-penalty X   OpenAI's, in [-2, 2]; 0 off\n"
            "  -s, --seed S             sampling seed (-1 or absent: random, shown by --stats)\n"
            "  --stop STR               stop before this text (repeatable)\n"
            "  --min-new-tokens N       no eos before N new tokens\n"
            "  --lookup N               n-gram lookup candidates a step, 0 off (default 8)\n"
            "  --grammar GBNF, --grammar-file F        keep the reply to a GBNF grammar\n"
            "  -j, --json-schema JSON, --json-schema-file F   ... to JSON that this schema\n"
            "                           accepts (draft 2020-12; refused keywords are named)\n"
            CLI_TEMPLATE_FILE_USAGE
            "  --draft M2               a smaller model with the same vocabulary proposes tokens\n"
            "  --n-draft K              tokens the draft proposes a step (default 4, max 16)\n"
            "  -t, --threads N          compute threads (default: the cores)\n"
            "  -c, --max-cache-len N    KV cache positions (default min(model max, 4096))\n"
            "  --precision P            preserve | balanced | int8 | int4\n"
            CLI_QUANT_USAGE
            "  --cache-dir DIR          packed-weight cache for balanced/int4 (default\n"
            "                           $KWKER_CACHE or ~/.cache/kwker/packs; off: none)\n"
            "  --stats                  print prompt/reuse/speed/finish figures to stderr\n");
}

static int parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_seed(const char *s, struct cli_gen_opts *o)
{
    char *end;
    if (!strcmp(s, "-1")) {
        o->seed_given = 0;
        return 0;
    }
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end || errno || s[0] == '-')
        return -1;
    o->smp.seed = (uint64_t)v;
    o->seed_given = 1;
    return 0;
}

static int add_stop(struct cli_gen_opts *o, const char *s)
{
    const char **a = realloc(o->stop, sizeof *a * (size_t)(o->n_stop + 1));
    if (!a)
        return -1;
    o->stop = a;
    o->stop[o->n_stop++] = s;
    return 0;
}

static int is(const char *a, const char *x, const char *y, const char *z)
{
    return !strcmp(a, x) || (y && !strcmp(a, y)) || (z && !strcmp(a, z));
}

/* One option that takes a value v; -1 for a bad value, 1 when a is not one of these. */
static int parse_valued(struct cli_gen_opts *o, const char *a, const char *v)
{
    if (is(a, "-m", "--model", NULL))
        return o->model = v, 0;
    if (is(a, "--draft", "-md", "--model-draft"))
        return o->draft = v, 0;
    if (is(a, "--system", "-sys", "--system-prompt"))
        return o->system = v, 0;
    if (is(a, "--chat-template-file", NULL, NULL))
        return v[0] ? (o->chat_template_file = v, 0) : -1;
    if (is(a, "--chat-template-kwargs", NULL, NULL))
        return o->chat_template_kwargs = v, 0;
    if (is(a, "--n-draft", "--draft-max", NULL))
        return cli_parse_int(v, 1, 16, &o->n_draft);
    if (is(a, "-n", "--n-predict", "--max-new-tokens"))
        return cli_parse_int(v, -1, 1 << 24, &o->n_predict);
    if (is(a, "--temperature", "--temp", NULL))
        return parse_double(v, 0, 1e6, &o->temperature);
    if (is(a, "--top-k", NULL, NULL))
        return cli_parse_int(v, 0, 1 << 30, &o->top_k);
    if (is(a, "--top-p", NULL, NULL))
        return parse_double(v, 1e-9, 1, &o->top_p);
    if (is(a, "--min-p", NULL, NULL))
        return parse_double(v, 0, 1, &o->min_p);
    if (is(a, "--repeat-penalty", "--repetition-penalty", NULL))
        return parse_double(v, 1e-6, 1e6, &o->smp.repetition_penalty);
    if (is(a, "--presence-penalty", NULL, NULL))
        return parse_double(v, -2, 2, &o->smp.presence_penalty);
    if (is(a, "--frequency-penalty", NULL, NULL))
        return parse_double(v, -2, 2, &o->smp.frequency_penalty);
    if (is(a, "-s", "--seed", NULL))
        return parse_seed(v, o);
    if (is(a, "--stop", "-r", "--reverse-prompt"))
        return v[0] ? add_stop(o, v) : -1;
    if (is(a, "--min-new-tokens", NULL, NULL))
        return cli_parse_int(v, 0, 1 << 24, &o->smp.min_new_tokens);
    if (is(a, "--grammar", NULL, NULL))
        return o->grammar = v, 0;
    if (is(a, "--grammar-file", NULL, NULL))
        return v[0] ? (o->grammar_file = v, 0) : -1;
    if (is(a, "-j", "--json-schema", NULL))
        return o->json_schema = v, 0;
    if (is(a, "--json-schema-file", NULL, NULL))
        return v[0] ? (o->json_schema_file = v, 0) : -1;
    if (is(a, "--lookup", NULL, NULL))
        return cli_parse_int(v, 0, 16, &o->lookup);
    if (is(a, "-t", "--threads", NULL))
        return cli_parse_int(v, 1, 1024, &o->dec.n_threads);
    if (is(a, "-c", "--max-cache-len", "--ctx-size"))
        return cli_parse_int(v, 2, 1 << 24, &o->dec.max_cache_len);
    if (is(a, "--precision", NULL, NULL))
        return (o->dec.precision = cli_parse_precision(v)) < 0 ? -1 : 0;
    if (is(a, "--cache-dir", NULL, NULL))
        return o->dec.cache_dir = cli_cache_dir(v), 0;
    return 1;
}

int cli_gen_parse(struct cli_gen_opts *o, const char *cmd, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    if (!strcmp(a, "--stats")) {
        o->stats = 1;
        return CLI_OPT_OK;
    }
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    int q = cli_quant_parse(&o->quant, a, v);
    if (q < 0) {
        fprintf(stderr, "kwker %s: bad or missing value for %s\n", cmd, a);
        return CLI_OPT_BAD;
    }
    if (q > 0) {
        *i += q - 1;
        return CLI_OPT_OK;
    }
    int rc = parse_valued(o, a, v ? v : "");
    if (rc == 1)
        return CLI_OPT_NONE;
    if (!v) {
        fprintf(stderr, "kwker %s: %s needs a value\n", cmd, a);
        return CLI_OPT_BAD;
    }
    if (rc < 0) {
        fprintf(stderr, "kwker %s: bad value '%s' for %s\n", cmd, v, a);
        return CLI_OPT_BAD;
    }
    (*i)++;
    return CLI_OPT_OK;
}

/* --grammar / --grammar-file / --json-schema / --json-schema-file into o->compiled. */
static int compile_grammar(struct cli_gen_opts *o, const char *cmd)
{
    const char *given[] = {o->grammar, o->grammar_file, o->json_schema, o->json_schema_file};
    int n = 0, which = -1;
    for (int k = 0; k < 4; k++)
        if (given[k])
            n++, which = k;
    if (n == 0)
        return 0;
    if (n > 1) {
        fprintf(stderr, "kwker %s: give one of --grammar, --grammar-file, --json-schema, "
                        "--json-schema-file\n", cmd);
        return -1;
    }
    static const char *const names[] = {"--grammar", "--grammar-file", "--json-schema",
                                        "--json-schema-file"};
    struct kwk_err err = {0};
    char *text = NULL;
    size_t n_text = 0;
    const char *src = given[which];
    if (which == 1 || which == 3) {
        if (kwk_read_file(src, KWK_GRAMMAR_TEXT_MAX, &text, &n_text, &err)) {
            fprintf(stderr, "kwker %s: %s: %s\n", cmd, names[which], err.msg);
            return -1;
        }
        src = text;
    } else {
        n_text = strlen(src);
    }
    o->compiled = which < 2 ? kwk_grammar_new(src, n_text, &err)
                            : kwk_grammar_from_json_schema(src, n_text, &err);
    if (!o->compiled)
        fprintf(stderr, "kwker %s: %s%s%s: %s\n", cmd, names[which], text ? " " : "",
                text ? given[which] : "", err.msg);
    kwk_free(text);
    return o->compiled ? 0 : -1;
}

int cli_gen_finish(struct cli_gen_opts *o, const char *cmd)
{
    struct kwk_sampler_params *p = &o->smp;
    p->do_sample = o->temperature > 0;
    p->temperature = o->temperature > 0 ? o->temperature : 1.0;
    /* Only the sampling steps differ between greedy and sampling: keep HF's (inactive) values
     * for greedy so the sampler's checks see sane numbers. */
    p->top_k = o->top_k >= 0 ? o->top_k : (p->do_sample ? 40 : 0);
    p->top_p = o->top_p > 0 ? o->top_p : (p->do_sample ? 0.95 : 1.0);
    p->min_p = o->min_p >= 0 ? o->min_p : (p->do_sample ? 0.05 : 0.0);
    if (!o->seed_given) {
        uint64_t seed = 0;
        if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
            seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
        p->seed = seed;
    }
    struct kwk_err err = {0};
    if (kwk_sampler_params_check(p, &err)) {
        fprintf(stderr, "kwker %s: %s\n", cmd, err.msg);
        return -1;
    }
    if (!o->model) {
        fprintf(stderr, "kwker %s: --model is required\n", cmd);
        return -1;
    }
    return compile_grammar(o, cmd);
}

/* Create a decoder with SIGINT blocked, so its pool's worker threads inherit the block and a
 * Ctrl-C always reaches the main thread (where chat polls its flag). */
static kwk_decoder *decoder_new_quiet(const kwk_model *m, const struct kwk_decoder_params *p,
                                      struct kwk_err *err)
{
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    kwk_decoder *d = kwk_decoder_new(m, p, err);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return d;
}

int cli_session_open(struct cli_session *s, const struct cli_gen_opts *o, int need_tok,
                     const char *cmd)
{
    struct kwk_err err = {0};
    struct kwk_model_info info;
    memset(s, 0, sizeof *s);
    if (need_tok && !(s->tok = kwk_tokenizer_load(o->model, &err)))
        goto fail;
    /* the calibration ids live in o->quant (freed with the options) */
    if (cli_quant_load((struct cli_quant *)&o->quant, o->model, cmd)) {
        cli_session_close(s);
        return -1;
    }
    struct kwk_decoder_params mp = o->dec;
    mp.mix_bits = o->quant.mix_bits;
    mp.calib = o->quant.ids;
    mp.n_calib = (int64_t)o->quant.n_ids;
    mp.gptq = o->quant.gptq;
    mp.act_bits = o->quant.act_bits;
    mp.kv_bits = o->quant.kv_bits;
    if (!(s->m = kwk_model_load(o->model, &err)) ||
        !(s->d = decoder_new_quiet(s->m, &mp, &err)))
        goto fail;
    kwk_model_get_info(s->m, &info);
    s->n_eos = info.n_eos < 8 ? info.n_eos : 8;
    memcpy(s->eos, info.eos_ids, sizeof(int32_t) * (size_t)s->n_eos);
    if (s->n_eos == 0 && s->tok) {
        int n = kwk_tokenizer_eos_ids(s->tok, s->eos, 8);
        s->n_eos = n < 0 ? 0 : n > 8 ? 8 : n;
    }
    /* kwk_decoder_new's default: min(max_position, 4096) */
    s->cache_len = o->dec.max_cache_len;
    if (!s->cache_len)
        s->cache_len = info.max_position > 0 && info.max_position < 4096 ? info.max_position
                                                                         : 4096;
    if (o->draft) {
        struct kwk_decoder_params dp = o->dec; /* the draft is not calibrated */
        dp.mix_bits = o->quant.mix_bits;
        dp.act_bits = o->quant.act_bits;
        dp.kv_bits = o->quant.kv_bits;
        if (!(s->dm = kwk_model_load(o->draft, &err)) ||
            !(s->dd = decoder_new_quiet(s->dm, &dp, &err)))
            goto fail;
        struct kwk_model_info di;
        kwk_model_get_info(s->dm, &di);
        if (di.n_vocab != info.n_vocab) {
            fprintf(stderr, "kwker %s: the draft's vocabulary (%d) differs from the model's "
                            "(%d)\n", cmd, di.n_vocab, info.n_vocab);
            cli_session_close(s);
            return -1;
        }
    }
    return 0;
fail:
    fprintf(stderr, "kwker %s: %s\n", cmd, err.msg[0] ? err.msg : kwk_status_str(err.code));
    cli_session_close(s);
    return -1;
}

void cli_session_close(struct cli_session *s)
{
    kwk_decoder_free(s->dd);
    kwk_decoder_free(s->d);
    kwk_model_free(s->dm);
    kwk_model_free(s->m);
    kwk_grammar_vocab_free(s->gvocab);
    kwk_tokenizer_free(s->tok);
    memset(s, 0, sizeof *s);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int on_token(void *user, int32_t token, const char *text, size_t len)
{
    struct cli_stream *st = user;
    if (st->timing && st->timing->t_first == 0)
        st->timing->t_first = now_s();
    if (st->print_text) {
        if (len)
            fwrite(text, 1, len, stdout);
    } else {
        printf("%s%d", st->n_printed ? "," : "", token);
    }
    st->n_printed++;
    fflush(stdout);
    return st->cancel && *st->cancel;
}

void cli_output_free(struct kwk_gen_output *out)
{
    kwk_gen_output_clear(out);
    free(out->tokens);
    out->tokens = NULL;
    out->cap = 0;
}

int cli_generate(struct cli_session *s, const struct cli_gen_opts *o, const int32_t *ids, int n,
                 int max_new, struct cli_stream *st, struct kwk_gen_output *out,
                 const char *cmd)
{
    struct kwk_gen_params p;
    struct kwk_err err = {0};
    kwk_gen_params_init(&p);
    memset(out, 0, sizeof *out);
    p.max_new_tokens = max_new;
    p.sampling = o->smp;
    p.eos_ids = s->eos;
    p.n_eos = s->n_eos;
    p.stop = o->stop;
    p.n_stop = o->n_stop;
    p.tok = s->tok;
    p.prompt_cache = 1;
    p.lookup = o->lookup;
    p.draft = s->dd;
    p.n_draft = o->n_draft;
    p.on_token = on_token;
    p.user = st;
    if (o->compiled) {
        if (!s->gvocab && !(s->gvocab = kwk_grammar_vocab_new(s->tok, &err))) {
            fprintf(stderr, "kwker %s: %s\n", cmd, err.msg);
            return -1;
        }
        p.grammar = o->compiled;
        p.grammar_vocab = s->gvocab;
    }
    out->cap = max_new > 0 ? max_new : 1;
    out->tokens = malloc(sizeof(int32_t) * (size_t)out->cap);
    if (!out->tokens) {
        fprintf(stderr, "kwker %s: out of memory\n", cmd);
        return -1;
    }
    if (st->timing) {
        st->timing->t_first = 0;
        st->timing->t_start = now_s();
    }
    int rc = kwk_generate(s->d, ids, n, &p, out, &err);
    if (st->timing)
        st->timing->t_end = now_s();
    if (rc < 0) {
        fflush(stdout);
        fprintf(stderr, "%skwker %s: %s\n", st->n_printed ? "\n" : "", cmd,
                err.msg[0] ? err.msg : kwk_status_str(rc));
        return -1;
    }
    return 0;
}

static const char *finish_name(int f)
{
    switch (f) {
    case KWK_FINISH_STOP: return "stop";
    case KWK_FINISH_LENGTH: return "length";
    case KWK_FINISH_CANCELED: return "canceled";
    default: return "none";
    }
}

void cli_print_stats(FILE *f, const struct kwk_gen_output *out, const struct cli_timing *t,
                     const struct cli_gen_opts *o)
{
    double first = t->t_first > 0 ? t->t_first - t->t_start : t->t_end - t->t_start;
    double gen = t->t_first > 0 ? t->t_end - t->t_first : 0;
    int n_read = out->n_prompt - out->prompt_reused;
    fprintf(f, "[stats] prompt %d tokens, reused %d, read %d (%.1f tokens/s) | first token "
               "%.3f s | generated %d tokens, %.1f tokens/s | proposed %d, accepted %d, "
               "%d passes | finish %s",
            out->n_prompt, out->prompt_reused, n_read, first > 0 ? n_read / first : 0.0, first,
            out->n_tokens, gen > 0 && out->n_tokens > 1 ? (out->n_tokens - 1) / gen : 0.0,
            out->n_proposed, out->n_accepted, out->n_steps, finish_name(out->finish_reason));
    if (o->smp.do_sample)
        fprintf(f, " | seed %llu", (unsigned long long)o->smp.seed);
    fprintf(f, "\n");
}
