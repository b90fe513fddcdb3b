/* cmd_embed.c - `kwker embed`: embeddings of texts (arguments, or stdin one per line) from an
 * encoder model, printed as JSON arrays of floats. Main thread only. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kwker.h"

#define EMBED_LINE_MAX ((size_t)1 << 20) /* bytes of one stdin line, as serve's body limit */
#define EMBED_CHUNK 256                  /* texts embedded per call: output streams by chunk */

struct embed_opts {
    const char *model;
    struct kwk_encoder_params p;
    int json;
};

struct embed_run {
    kwk_tokenizer *tok;
    kwk_encoder *enc;
    int dim, max_tokens, n_done, json;
    int32_t *ids, offs[EMBED_CHUNK + 1];
    float *out;
    size_t cap_ids;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kwker embed --model M [options] [TEXT ...]\n"
            "Embeddings of each TEXT (without any: of each line of stdin) from an embedding\n"
            "model (an encoder such as all-MiniLM-L6-v2): one JSON array of floats per line.\n"
            CLI_ENCODER_USAGE
            CLI_ENCODER_PRECISION_USAGE
            CLI_POOLING_USAGE
            "  --json                   one object instead: {\"model\", \"dim\",\n"
            "                           \"data\": [[...], ...]}\n");
}

/* One option at argv[*i]; 0, 1 when it is not an option (a text), -1 on a bad value. */
static int parse_opt(struct embed_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--json"))
        return o->json = 1, 0;
    if (!strcmp(a, "--normalize") || !strcmp(a, "--no-normalize"))
        return o->p.normalize = !strcmp(a, "--normalize"), 0;
    int st = cli_encoder_opt(a, v, 1, &o->model, &o->p);
    if (st == 1)
        return a[0] == '-' && a[1] ? -1 : 1;
    *i += st == 0;
    return st;
}

static void print_vec(const float *v, int dim)
{
    putchar('[');
    for (int k = 0; k < dim; k++) {
        if (k)
            putchar(',');
        /* %.9g reads back as the same float32; JSON has no NaN: null (as the server writes) */
        if (isfinite(v[k]))
            printf("%.9g", (double)v[k]);
        else
            fputs("null", stdout);
    }
    putchar(']');
}

/* Tokenize text (add_special, as the server does) onto the chunk's ids as sequence k. */
static int add_text(struct embed_run *r, int k, const char *text, size_t len)
{
    size_t used = (size_t)r->offs[k], n = 0, max = (size_t)r->max_tokens;
    if (used + max > r->cap_ids) {
        size_t cap = r->cap_ids * 2 > used + max ? r->cap_ids * 2 : used + max;
        int32_t *p = realloc(r->ids, sizeof(int32_t) * cap);
        if (!p) {
            fprintf(stderr, "kwker embed: out of memory\n");
            return -1;
        }
        r->ids = p;
        r->cap_ids = cap;
    }
    int idx = r->n_done + k; /* texts count from 0, as the server's inputs */
    if (len == 0) {
        fprintf(stderr, "kwker embed: text %d is empty\n", idx);
        return -1;
    }
    int st = kwk_tokenizer_encode(r->tok, text, len, 1, r->ids + used, max, &n);
    if (st == KWK_ELIMIT) {
        fprintf(stderr, "kwker embed: text %d has %zu tokens, more than the model's %d\n", idx,
                n, r->max_tokens);
        return -1;
    }
    if (st < 0) {
        fprintf(stderr, "kwker embed: text %d: tokenizing: %s\n", idx, kwk_status_str(st));
        return -1;
    }
    r->offs[k + 1] = (int32_t)(used + n);
    return 0;
}

/* Embed and print the chunk's n texts. */
static int flush(struct embed_run *r, int n)
{
    struct kwk_err err = {0};
    if (n == 0)
        return 0;
    if (kwk_encoder_embed(r->enc, r->ids, r->offs, n, r->out, &err)) {
        fprintf(stderr, "kwker embed: %s\n", err.msg[0] ? err.msg : kwk_status_str(err.code));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (r->json)
            fputs(r->n_done + i ? "," : "", stdout);
        print_vec(r->out + (size_t)i * (size_t)r->dim, r->dim);
        if (!r->json)
            putchar('\n');
    }
    r->n_done += n;
    return 0;
}

/* The texts of argv[first..argc), or stdin's lines when there are none. */
static int embed_all(struct embed_run *r, int argc, char **argv, int first)
{
    int k = 0, rc = 0;
    char *line = NULL;
    size_t cap = 0;
    for (int i = first; i < argc && !rc; i++) {
        rc = add_text(r, k, argv[i], strlen(argv[i]));
        if (!rc && ++k == EMBED_CHUNK)
            rc = flush(r, k), k = 0;
    }
    for (long no = 1; first == argc && !rc; no++) {
        ssize_t len = getline(&line, &cap, stdin);
        if (len < 0)
            break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        if ((size_t)len > EMBED_LINE_MAX) {
            fprintf(stderr, "kwker embed: stdin line %ld is longer than %zu bytes\n", no,
                    EMBED_LINE_MAX);
            rc = -1;
        } else if (!(rc = add_text(r, k, line, (size_t)len)) && ++k == EMBED_CHUNK) {
            rc = flush(r, k), k = 0;
        }
    }
    free(line);
    return rc ? rc : flush(r, k);
}

/* The --json header: the model as a JSON string (jansson escapes it). */
static int print_head(const char *model, int dim)
{
    json_t *m = json_string(model);
    char *s = m ? json_dumps(m, JSON_ENCODE_ANY) : NULL;
    if (s)
        printf("{\"model\":%s,\"dim\":%d,\"data\":[", s, dim);
    free(s);
    json_decref(m);
    if (!s)
        fprintf(stderr, "kwker embed: the model's name is not UTF-8\n");
    return s ? 0 : -1;
}

static int run(const struct embed_opts *o, int argc, char **argv, int first)
{
    struct kwk_model_info info;
    struct embed_run r = {.json = o->json};
    kwk_model *m = NULL;
    int rc = 1;
    if (cli_encoder_load("embed", "an embedding model", o->model, &o->p, &r.tok, &m, &r.enc,
                         &info))
        return 1;
    r.dim = kwk_encoder_dim(r.enc);
    r.max_tokens = kwk_encoder_max_tokens(r.enc);
    if (!(r.out = malloc(sizeof(float) * (size_t)r.dim * EMBED_CHUNK))) {
        fprintf(stderr, "kwker embed: out of memory\n");
        goto out;
    }
    if (o->json && print_head(o->model, r.dim))
        goto out;
    if (embed_all(&r, argc, argv, first) == 0)
        rc = 0;
    if (o->json && rc == 0)
        puts("]}");
out:
    if (fflush(stdout) && rc == 0) {
        perror("kwker embed: stdout");
        rc = 1;
    }
    free(r.out);
    free(r.ids);
    kwk_encoder_free(r.enc);
    kwk_model_free(m);
    kwk_tokenizer_free(r.tok);
    return rc;
}

/* Options may come before or after the texts (but not after "--"): the texts are moved, in
 * order, to the end of argv, from the returned index on. */
int cmd_embed(int argc, char **argv)
{
    struct embed_opts o = {0};
    int n_texts = 0, rest = 0;
    kwk_encoder_params_init(&o.p);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!rest && (!strcmp(a, "-h") || !strcmp(a, "--help"))) {
            usage(stdout);
            return 0;
        }
        if (!rest && !strcmp(a, "--")) {
            rest = 1;
            continue;
        }
        int st = rest ? 1 : parse_opt(&o, argc, argv, &i);
        if (st < 0) {
            fprintf(stderr, "kwker embed: bad or missing value for '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (st > 0)
            argv[1 + n_texts++] = (char *)a; /* never past i: the options are behind */
    }
    if (!o.model) {
        usage(stderr);
        return 2;
    }
    return run(&o, 1 + n_texts, argv, 1);
}
