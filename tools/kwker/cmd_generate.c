/* cmd_generate.c - kwker generate: one generation from token ids, a text prompt or one chat
 * message, streamed to stdout (ids comma-separated for --ids, text otherwise). Main thread
 * only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_gen.h"

#define MAX_IDS 65536

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kwker generate --model M (--ids 1,2,3 | --prompt TEXT | --chat MESSAGE)\n"
            "                      [--system TEXT] [options]\n"
            "  --ids 1,2,3     prompt token ids; prints the new ids, comma-separated (-n default "
            "16)\n"
            "  -p, --prompt T  text tokenized as is (with the tokenizer's special tokens, e.g. "
            "BOS);\n"
            "                  prints the new text as it comes (-n default 128)\n"
            "  --chat MESSAGE  one user message in the model's chat template (with --system "
            "TEXT\n"
            "                  before it) and the assistant prompt; prints the reply\n");
    cli_gen_usage(f);
}

/* The prompt ids of --prompt or --chat, into a library-allocated array. */
static int text_prompt(struct cli_session *s, const struct cli_gen_opts *o, const char *prompt,
                       const char *chat, int32_t **ids, size_t *n)
{
    if (prompt) {
        int st = kwk_tokenizer_encode_alloc(s->tok, prompt, strlen(prompt), 1, ids, n);
        if (st < 0)
            fprintf(stderr, "kwker generate: tokenizing the prompt: %s\n", kwk_status_str(st));
        return st < 0 ? -1 : 0;
    }
    struct cli_conv c;
    if (cli_conv_init(&c, s->tok, o->chat_template_file, o->chat_template_kwargs,
                      "generate"))
        return -1;
    int rc = -1;
    if ((o->system && cli_conv_add(&c, "system", o->system)) || cli_conv_add(&c, "user", chat))
        fprintf(stderr, "kwker generate: the message is not valid UTF-8\n");
    else
        rc = cli_conv_ids(&c, s->tok, ids, n, "generate");
    cli_conv_free(&c);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    const char *ids_arg = NULL, *prompt = NULL, *chat = NULL;
    struct cli_gen_opts o;
    cli_gen_opts_init(&o, -2); /* -2: not given; the default depends on the mode */
    int rc = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            rc = 0;
            goto out_opts;
        }
        int st = cli_gen_parse(&o, "generate", argc, argv, &i);
        if (st == CLI_OPT_BAD)
            goto out_opts;
        if (st == CLI_OPT_OK)
            continue;
        if (v && !strcmp(a, "--ids")) {
            ids_arg = v;
        } else if (v && (!strcmp(a, "--prompt") || !strcmp(a, "-p"))) {
            prompt = v;
        } else if (v && !strcmp(a, "--chat")) {
            chat = v;
        } else {
            fprintf(stderr, "kwker generate: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            goto out_opts;
        }
        i++;
    }
    if (!!ids_arg + !!prompt + !!chat != 1) {
        fprintf(stderr, "kwker generate: give exactly one of --ids, --prompt, --chat\n");
        usage(stderr);
        goto out_opts;
    }
    if (o.system && !chat) {
        fprintf(stderr, "kwker generate: --system goes with --chat\n");
        goto out_opts;
    }
    if (o.n_predict == -2)
        o.n_predict = ids_arg ? 16 : 128;
    if (cli_gen_finish(&o, "generate"))
        goto out_opts;

    rc = 1;
    struct cli_session s;
    struct kwk_gen_output out = {0};
    struct cli_timing t = {0};
    struct cli_stream st = {.print_text = !ids_arg, .timing = &t};
    int32_t *ids = NULL, *tok_ids = NULL;
    size_t n_ids = 0;
    if (ids_arg) {
        int n;
        ids = malloc(sizeof(int32_t) * MAX_IDS);
        if (!ids || (n = cli_parse_ids(ids_arg, (int *)ids, MAX_IDS)) < 1) {
            fprintf(stderr, "kwker generate: --ids needs comma-separated token ids\n");
            rc = 2;
            goto out_ids;
        }
        n_ids = (size_t)n;
    }
    if (cli_session_open(&s, &o, !ids_arg || o.n_stop > 0 || o.compiled, "generate"))
        goto out_ids;
    if (!ids_arg) {
        if (text_prompt(&s, &o, prompt, chat, &tok_ids, &n_ids))
            goto out_session;
        if (n_ids == 0) {
            fprintf(stderr, "kwker generate: the prompt has no tokens\n");
            goto out_session;
        }
    }
    if (n_ids >= (size_t)s.cache_len) {
        fprintf(stderr, "kwker generate: the prompt has %zu tokens; the cache holds %d "
                        "(--max-cache-len)\n", n_ids, s.cache_len);
        goto out_session;
    }
    /* the cache bounds the reply anyway; a bound here keeps the buffers small for -n -1 */
    int room = s.cache_len - (int)n_ids + 1;
    int max_new = o.n_predict < 0 || o.n_predict > room ? room : o.n_predict;
    if (cli_generate(&s, &o, ids_arg ? ids : tok_ids, (int)n_ids, max_new, &st, &out,
                     "generate"))
        goto out_gen;
    printf("\n");
    fflush(stdout);
    if (o.stats)
        cli_print_stats(stderr, &out, &t, &o);
    rc = 0;
out_gen:
    cli_output_free(&out);
out_session:
    kwk_tokenizer_mem_free(tok_ids);
    cli_session_close(&s);
out_ids:
    free(ids);
out_opts:
    cli_gen_opts_free(&o);
    return rc;
}
