/* cmd_generate.c - kwker generate: greedy tokens from a prompt of token ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define MAX_IDS 65536

static void usage(FILE *f)
{
    fprintf(f, "usage: kwker generate --model M --ids 1,2,3 [-n 16] [-t threads] "
               "[--max-cache-len N] [--precision preserve]\n"
               "  prints the new token ids, comma-separated\n");
}

int cmd_generate(int argc, char **argv)
{
    const char *model = NULL, *ids_arg = NULL;
    struct kwk_decoder_params params;
    kwk_decoder_params_init(&params);
    int n_new = 16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model") && v) {
            model = v;
        } else if (!strcmp(a, "--ids") && v) {
            ids_arg = v;
        } else if ((!strcmp(a, "-n") || !strcmp(a, "--max-new-tokens")) && v) {
            bad = cli_parse_int(v, 0, 1 << 24, &n_new);
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && v) {
            bad = cli_parse_int(v, 1, 1024, &params.n_threads);
        } else if (!strcmp(a, "--max-cache-len") && v) {
            bad = cli_parse_int(v, 1, 1 << 24, &params.max_cache_len);
        } else if (!strcmp(a, "--precision") && v) {
            bad = (params.precision = cli_parse_precision(v)) < 0;
        } else {
            fprintf(stderr, "kwker generate: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "kwker generate: bad value '%s' for %s\n", v, a);
            return 2;
        }
        i++;
    }
    if (!model || !ids_arg) {
        usage(stderr);
        return 2;
    }
    int rc = 1;
    int *ids = malloc(sizeof(int) * MAX_IDS);
    int32_t *out = malloc(sizeof(int32_t) * (size_t)(n_new ? n_new : 1));
    kwk_model *m = NULL;
    kwk_decoder *d = NULL;
    int n_ids = ids ? cli_parse_ids(ids_arg, ids, MAX_IDS) : -1;
    if (!out || n_ids < 1) {
        fprintf(stderr, "kwker generate: --ids needs comma-separated token ids\n");
        goto out;
    }
    struct kwk_err err = {0};
    m = kwk_model_load(model, &err);
    if (!m) {
        fprintf(stderr, "kwker generate: %s\n", err.msg);
        goto out;
    }
    d = kwk_decoder_new(m, &params, &err);
    if (!d) {
        fprintf(stderr, "kwker generate: %s\n", err.msg);
        goto out;
    }
    struct kwk_model_info info;
    kwk_model_get_info(m, &info);
    int n_out = 0;
    int st = kwk_decoder_generate_greedy(d, (const int32_t *)ids, n_ids, n_new,
                                         (const int32_t *)info.eos_ids, info.n_eos, out, &n_out);
    if (st < 0) {
        fprintf(stderr, "kwker generate: %s\n", kwk_status_str(st));
        goto out;
    }
    for (int i = 0; i < n_out; i++)
        printf("%s%d", i ? "," : "", out[i]);
    printf("\n");
    rc = 0;
out:
    kwk_decoder_free(d);
    kwk_model_free(m);
    free(ids);
    free(out);
    return rc;
}
