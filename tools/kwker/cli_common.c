/* cli_common.c - option parsing helpers shared by the kwker subcommands. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_parse_ids(const char *s, int *ids, int cap)
{
    int n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 0x7fffffff || n >= cap)
            return -1;
        ids[n++] = (int)v;
        s = end;
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return n;
}

int cli_parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

int cli_parse_precision(const char *s)
{
    if (!strcmp(s, "preserve"))
        return KWK_PRECISION_PRESERVE;
    if (!strcmp(s, "balanced") || !strcmp(s, "int8"))
        return KWK_PRECISION_BALANCED;
    if (!strcmp(s, "int4"))
        return KWK_PRECISION_INT4;
    return -1;
}

int cli_parse_pooling(const char *s)
{
    static const char *const names[] = {[KWK_POOLING_MEAN] = "mean", [KWK_POOLING_CLS] = "cls",
                                        [KWK_POOLING_LAST] = "last", [KWK_POOLING_MAX] = "max",
                                        [KWK_POOLING_MEAN_SQRT_LEN] = "mean_sqrt_len"};
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (names[i] && !strcmp(s, names[i]))
            return i;
    return -1;
}

const char *cli_cache_dir(const char *v)
{
    static char home_dir[4096];
    if (v)
        return strcmp(v, "off") ? v : NULL;
    const char *env = getenv("KWKER_CACHE");
    if (env)
        return env[0] && strcmp(env, "off") ? env : NULL;
    const char *home = getenv("HOME");
    if (!home || !home[0])
        return NULL;
    int n = snprintf(home_dir, sizeof home_dir, "%s/.cache/kwker/packs", home);
    return n > 0 && (size_t)n < sizeof home_dir ? home_dir : NULL;
}

void cli_quant_init(struct cli_quant *q)
{
    memset(q, 0, sizeof *q);
    q->calib_tokens = 4096;
}

int cli_quant_parse(struct cli_quant *q, const char *a, const char *v)
{
    if (!strcmp(a, "--gptq"))
        return q->gptq = 1, 1;
    int ours = !strcmp(a, "--mix-bits") || !strcmp(a, "--calib") || !strcmp(a, "--calib-tokens") ||
               !strcmp(a, "--act-bits") || !strcmp(a, "--kv-bits");
    if (!ours)
        return 0;
    if (!v)
        return -1;
    if (!strcmp(a, "--calib"))
        return v[0] ? (q->calib_file = v, 2) : -1;
    if (!strcmp(a, "--calib-tokens"))
        return cli_parse_int(v, 1, 1 << 20, &q->calib_tokens) ? -1 : 2;
    if (!strcmp(a, "--kv-bits"))
        return cli_parse_int(v, 16, 32, &q->kv_bits) || (q->kv_bits != 16 && q->kv_bits != 32) ? -1
                                                                                               : 2;
    if (!strcmp(a, "--act-bits"))
        return cli_parse_int(v, 8, 16, &q->act_bits) || (q->act_bits != 8 && q->act_bits != 16)
                   ? -1
                   : 2;
    if (cli_parse_int(v, 4, 8, &q->mix_bits) || (q->mix_bits != 4 && q->mix_bits != 6 &&
                                                 q->mix_bits != 8))
        return -1;
    return 2;
}

/* The calibration text: no more than calib_tokens could need (a token is rarely over 32 bytes),
 * so a long book is not read whole for 4096 tokens. */
static char *read_head(const char *path, size_t cap, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc(cap + 1);
    size_t n = buf ? fread(buf, 1, cap, f) : 0;
    int bad = !buf || ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

int cli_quant_load(struct cli_quant *q, const char *model, const char *cmd)
{
    if (q->gptq && !q->calib_file) {
        fprintf(stderr, "kwker %s: --gptq needs --calib FILE\n", cmd);
        return -1;
    }
    if (!q->calib_file)
        return 0;
    size_t len = 0;
    char *text = read_head(q->calib_file, (size_t)q->calib_tokens * 32, &len);
    if (!text) {
        fprintf(stderr, "kwker %s: --calib %s: %s\n", cmd, q->calib_file, strerror(errno));
        return -1;
    }
    struct kwk_err err = {0};
    kwk_tokenizer *t = kwk_tokenizer_load(model, &err);
    int rc = t ? kwk_tokenizer_encode_alloc(t, text, len, 0, &q->ids, &q->n_ids) : err.code;
    kwk_tokenizer_free(t);
    free(text);
    if (rc || q->n_ids == 0) {
        fprintf(stderr, "kwker %s: --calib %s: %s\n", cmd, q->calib_file,
                rc ? (err.msg[0] ? err.msg : kwk_status_str(rc)) : "no tokens");
        return -1;
    }
    if (q->n_ids > (size_t)q->calib_tokens)
        q->n_ids = (size_t)q->calib_tokens;
    return 0;
}

void cli_quant_free(struct cli_quant *q)
{
    kwk_tokenizer_mem_free(q->ids);
    q->ids = NULL;
    q->n_ids = 0;
}

int cli_encoder_opt(const char *a, const char *v, int pooling, const char **model,
                    struct kwk_encoder_params *p)
{
    int is_model = !strcmp(a, "-m") || !strcmp(a, "--model");
    int is_threads = !strcmp(a, "-t") || !strcmp(a, "--threads");
    int is_pooling = pooling && !strcmp(a, "--pooling");
    if (!is_model && !is_threads && !is_pooling && strcmp(a, "--precision") &&
        strcmp(a, "--act-bits"))
        return 1;
    if (!v)
        return -1;
    if (is_model)
        return *model = v, 0;
    if (is_threads)
        return cli_parse_int(v, 1, 1024, &p->n_threads);
    if (is_pooling)
        return (p->pooling = cli_parse_pooling(v)) < 0 ? -1 : 0;
    if (!strcmp(a, "--precision"))
        return (p->precision = cli_parse_precision(v)) < 0 ? -1 : 0;
    return cli_parse_int(v, 8, 16, &p->act_bits) || (p->act_bits != 8 && p->act_bits != 16)
               ? -1
               : 0;
}

int cli_encoder_load(const char *cmd, const char *what, const char *path,
                     const struct kwk_encoder_params *p, kwk_tokenizer **tok, kwk_model **m,
                     kwk_encoder **enc, struct kwk_model_info *info)
{
    struct kwk_err err = {0};
    *enc = NULL;
    *m = NULL;
    if (!(*tok = kwk_tokenizer_load(path, &err)) || !(*m = kwk_model_load(path, &err)))
        goto fail;
    kwk_model_get_info(*m, info);
    if (!info->is_encoder) {
        fprintf(stderr, "kwker %s: %s is a generative model (%s), not %s\n", cmd, path,
                info->arch_name, what);
        goto out;
    }
    if ((*enc = kwk_encoder_new(*m, p, &err)))
        return 0;
fail:
    fprintf(stderr, "kwker %s: %s: %s\n", cmd, path,
            err.msg[0] ? err.msg : kwk_status_str(err.code));
out:
    kwk_model_free(*m);
    kwk_tokenizer_free(*tok);
    *m = NULL;
    *tok = NULL;
    return -1;
}
