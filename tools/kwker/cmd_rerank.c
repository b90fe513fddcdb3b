/* cmd_rerank.c - `kwker rerank`: documents (arguments, or stdin one per line) ordered by their
 * relevance to a query under a cross-encoder reranker, printed as the JSON object `kwker serve`
 * answers /v1/rerank with (serve/rerank.c builds both). Main thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kwker.h"
#include "serve/serve.h"

#define RERANK_LINE_MAX ((size_t)1 << 20) /* bytes of one stdin line, as serve's body limit */

struct rerank_opts {
    const char *model, *query;
    struct kwk_encoder_params p;
    int top_n, no_documents;
};

/* The documents as given: pointers into argv or stdin's lines (owned then). */
struct rerank_docs {
    const char **text;
    size_t *len;
    char **own;
    int n, cap;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kwker rerank --model M --query Q [options] [DOC ...]\n"
               "Score each DOC (without any: each line of stdin) for its relevance to Q with a\n"
               "reranker (a cross-encoder such as bge-reranker or ms-marco-MiniLM) and print the\n"
               "JSON object `kwker serve` answers POST /v1/rerank with (without its \"id\"): the\n"
               "documents by score, the highest first. Documents longer than the model are\n"
               "truncated, as sentence-transformers' CrossEncoder does.\n"
               CLI_ENCODER_USAGE
               "  -q, --query Q            the query (may be empty)\n"
               "  --top-n K                print the K best only (default: all)\n"
               "  --no-documents           results without their document's text\n"
               CLI_ENCODER_PRECISION_USAGE);
}

/* One option at argv[*i]; 0, 1 when it is not an option (a document), -1 on a bad value. */
static int parse_opt(struct rerank_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--no-documents"))
        return o->no_documents = 1, 0;
    int st = 1;
    if (!strcmp(a, "-q") || !strcmp(a, "--query"))
        st = v ? (o->query = v, 0) : -1;
    else if (!strcmp(a, "--top-n"))
        st = v ? cli_parse_int(v, 1, 1 << 30, &o->top_n) : -1;
    else
        st = cli_encoder_opt(a, v, 0, &o->model, &o->p);
    if (st == 1)
        return a[0] == '-' && a[1] ? -1 : 1;
    *i += st == 0;
    return st;
}

static int add_doc(struct rerank_docs *d, const char *text, size_t len, char *own)
{
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 64;
        const char **t = realloc(d->text, sizeof *t * (size_t)cap);
        if (t)
            d->text = t;
        size_t *l = t ? realloc(d->len, sizeof *l * (size_t)cap) : NULL;
        if (l)
            d->len = l;
        char **o = l ? realloc(d->own, sizeof *o * (size_t)cap) : NULL;
        if (!o) {
            free(own);
            fprintf(stderr, "kwker rerank: out of memory\n");
            return -1;
        }
        d->own = o;
        d->cap = cap;
    }
    d->text[d->n] = text;
    d->len[d->n] = len;
    d->own[d->n++] = own;
    return 0;
}

/* stdin's lines (without their line ends) as documents. */
static int read_docs(struct rerank_docs *d)
{
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    for (long no = 1; !rc; no++) {
        ssize_t len = getline(&line, &cap, stdin);
        if (len < 0)
            break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        if ((size_t)len > RERANK_LINE_MAX) {
            fprintf(stderr, "kwker rerank: stdin line %ld is longer than %zu bytes\n", no,
                    RERANK_LINE_MAX);
            rc = -1;
        } else {
            rc = add_doc(d, line, (size_t)len, line);
            line = NULL; /* owned by d now */
            cap = 0;
        }
    }
    free(line);
    if (!rc && ferror(stdin)) {
        perror("kwker rerank: stdin");
        rc = -1;
    }
    return rc;
}

static void free_docs(struct rerank_docs *d)
{
    for (int i = 0; i < d->n; i++)
        free(d->own[i]);
    free(d->text);
    free(d->len);
    free(d->own);
}

/* The reranker's checks as the server makes them: an encoder whose head has one label. */
static int check_model(const char *path, const struct kwk_model_info *info)
{
    const char *why = !info->n_labels    ? "is an embedding model without a classification "
                                           "head, not a reranker (a cross-encoder)"
                      : info->n_labels > 1 ? "has a classification head of more than one label, "
                                             "not a reranker's one relevance logit"
                                           : NULL;
    if (why)
        fprintf(stderr, "kwker rerank: %s (%s) %s\n", path, info->arch_name, why);
    return why ? -1 : 0;
}

/* Tokenize the pairs, run them through the head, print the reply. */
static int score(const struct rerank_opts *o, kwk_tokenizer *tok, kwk_encoder *enc, int act,
                 const struct rerank_docs *d)
{
    struct srv_rerank_req r;
    struct srv_err e;
    struct kwk_err err = {0};
    struct srv_buf b = {0};
    char model[256];
    float *logits = NULL;
    int rc = -1;
    if (srv_rerank_init(&r, o->query, strlen(o->query), d->text, d->len, d->n, o->top_n)) {
        fprintf(stderr, "kwker rerank: out of memory\n");
        return -1;
    }
    r.return_documents = !o->no_documents;
    struct srv_pair_enc pe = {.tok = tok};
    int packed = srv_rerank_pack(&r, srv_encode_pair, &pe, kwk_encoder_max_tokens(enc), &e);
    srv_pair_enc_free(&pe);
    if (packed) {
        fprintf(stderr, "kwker rerank: %s\n", e.msg);
        goto out;
    }
    if (!(logits = malloc(sizeof(float) * (size_t)(d->n ? d->n : 1)))) {
        fprintf(stderr, "kwker rerank: out of memory\n");
        goto out;
    }
    if (kwk_encoder_classify(enc, r.ids, r.types, r.offs, r.n_docs, logits, &err)) {
        fprintf(stderr, "kwker rerank: %s\n", err.msg[0] ? err.msg : kwk_status_str(err.code));
        goto out;
    }
    srv_rerank_scores(logits, r.n_docs, act);
    srv_model_id(model, sizeof model, o->model);
    srv_rerank_response(&b, NULL, model, &r, logits);
    if (b.err) {
        fprintf(stderr, "kwker rerank: out of memory\n");
        goto out;
    }
    fwrite(b.p, 1, b.len, stdout);
    putchar('\n');
    rc = 0;
out:
    srv_buf_free(&b);
    free(logits);
    srv_rerank_req_free(&r);
    return rc;
}

static int run(const struct rerank_opts *o, const struct rerank_docs *d)
{
    struct kwk_model_info info;
    kwk_tokenizer *tok = NULL;
    kwk_model *m = NULL;
    kwk_encoder *enc = NULL;
    int rc = 1;
    if (cli_encoder_load("rerank", "a reranker", o->model, &o->p, &tok, &m, &enc, &info))
        return 1;
    if (check_model(o->model, &info) == 0 && score(o, tok, enc, info.score_act, d) == 0)
        rc = 0;
    if (fflush(stdout) && rc == 0) {
        perror("kwker rerank: stdout");
        rc = 1;
    }
    kwk_encoder_free(enc);
    kwk_model_free(m);
    kwk_tokenizer_free(tok);
    return rc;
}

/* Options may come before or after the documents (but not after "--"). */
int cmd_rerank(int argc, char **argv)
{
    struct rerank_opts o = {0};
    struct rerank_docs d = {0};
    int rest = 0, rc = 2;
    kwk_encoder_params_init(&o.p);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!rest && (!strcmp(a, "-h") || !strcmp(a, "--help"))) {
            usage(stdout);
            rc = 0;
            goto out;
        }
        if (!rest && !strcmp(a, "--")) {
            rest = 1;
            continue;
        }
        int st = rest ? 1 : parse_opt(&o, argc, argv, &i);
        if (st < 0) {
            fprintf(stderr, "kwker rerank: bad or missing value for '%s'\n", a);
            usage(stderr);
            goto out;
        }
        if (st > 0 && add_doc(&d, a, strlen(a), NULL))
            goto out;
    }
    if (!o.model || !o.query) {
        usage(stderr);
        goto out;
    }
    if (d.n == 0 && read_docs(&d)) {
        rc = 1;
        goto out;
    }
    if (d.n == 0) {
        fprintf(stderr, "kwker rerank: no documents (give them as arguments or stdin lines)\n");
        goto out;
    }
    rc = run(&o, &d);
out:
    free_docs(&d);
    return rc;
}
