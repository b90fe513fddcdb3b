/* cmd_chat.c - kwker chat: an interactive chat on the terminal (or over a pipe). Each turn the
 * whole conversation is rendered with the model's chat template; prompt reuse means only the new
 * turn is read. Ctrl-C stops the reply being written, not the program. Main thread only (the
 * SIGINT handler only sets a flag). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_gen.h"

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kwker chat --model M [--system TEXT] [options]\n"
            "  One line per user turn from stdin (a line ending in \\ continues on the next);\n"
            "  /reset clears the conversation, /quit or end of input exits; Ctrl-C stops a\n"
            "  reply (at the prompt it exits). Replies go to stdout, -n default -1 (until eos).\n"
            "  -sys, --system TEXT      the system message\n");
    cli_gen_usage(f);
}

/* One user turn: lines joined while they end in a backslash. Returns the length, or -1 at end
 * of input or on Ctrl-C. *buf is reused between calls (free it). */
static ssize_t read_turn(char **buf, size_t *cap, int tty)
{
    size_t len = 0;
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t rc = -1;
    for (;;) {
        if (tty)
            fputs(len ? ". " : "> ", stdout), fflush(stdout);
        errno = 0;
        ssize_t n = getline(&line, &line_cap, stdin);
        if (n < 0 || interrupted)
            break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        int more = n > 0 && line[n - 1] == '\\';
        if (more)
            line[n - 1] = '\n'; /* the backslash becomes the line break it stands for */
        if (len + (size_t)n + 1 > *cap) {
            size_t c = (len + (size_t)n + 1) * 2;
            char *b = realloc(*buf, c);
            if (!b)
                break;
            *buf = b;
            *cap = c;
        }
        memcpy(*buf + len, line, (size_t)n);
        len += (size_t)n;
        (*buf)[len] = '\0';
        if (!more) {
            rc = (ssize_t)len;
            break;
        }
    }
    free(line);
    return rc;
}

/* Render the conversation into ids, dropping the oldest exchanges while the prompt and `reserve`
 * reply tokens do not fit the cache. Returns 0, or -1 (message printed; the caller drops the
 * turn). */
static int turn_ids(struct cli_session *s, struct cli_conv *c, int keep, int reserve,
                    int32_t **ids, size_t *n)
{
    for (;;) {
        if (cli_conv_ids(c, s->tok, ids, n, "chat"))
            return -1;
        if (*n + (size_t)reserve <= (size_t)s->cache_len)
            return 0;
        if (!cli_conv_drop_oldest(c, keep))
            break;
        kwk_tokenizer_mem_free(*ids);
        *ids = NULL;
        fprintf(stderr, "(the oldest exchange was dropped to fit the cache of %d tokens)\n",
                s->cache_len);
    }
    if (*n < (size_t)s->cache_len)
        return 0;
    fprintf(stderr, "kwker chat: this turn needs %zu tokens; the cache holds %d "
                    "(--max-cache-len)\n", *n, s->cache_len);
    kwk_tokenizer_mem_free(*ids);
    *ids = NULL;
    return -1;
}

/* One turn: generate the reply to the conversation, stream it, and add it to the history. */
static void chat_turn(struct cli_session *s, struct cli_conv *c, const struct cli_gen_opts *o,
                      int keep)
{
    int32_t *ids = NULL;
    size_t n = 0;
    int reserve = o->n_predict < 0 ? s->cache_len / 4 : o->n_predict;
    reserve = reserve < s->cache_len / 2 ? reserve : s->cache_len / 2;
    if (turn_ids(s, c, keep, reserve, &ids, &n)) {
        cli_conv_pop(c);
        return;
    }
    struct cli_timing t = {0};
    struct cli_stream st = {.print_text = 1, .cancel = &interrupted, .timing = &t};
    struct kwk_gen_output out = {0};
    int room = s->cache_len - (int)n + 1;
    int max_new = o->n_predict < 0 || o->n_predict > room ? room : o->n_predict;
    interrupted = 0;
    if (cli_generate(s, o, ids, (int)n, max_new, &st, &out, "chat")) {
        cli_conv_pop(c);
    } else {
        printf("\n");
        fflush(stdout);
        if (out.finish_reason == KWK_FINISH_CANCELED)
            fprintf(stderr, "(reply stopped)\n");
        if (cli_conv_add(c, "assistant", out.text ? out.text : "")) {
            fprintf(stderr, "kwker chat: the reply could not be kept in the history\n");
            cli_conv_pop(c);
        }
        if (o->stats)
            cli_print_stats(stderr, &out, &t, o);
    }
    interrupted = 0;
    cli_output_free(&out);
    kwk_tokenizer_mem_free(ids);
}

static int chat_loop(struct cli_session *s, struct cli_conv *c, const struct cli_gen_opts *o,
                     int keep)
{
    int tty = isatty(STDIN_FILENO);
    char *buf = NULL;
    size_t cap = 0;
    if (tty)
        fprintf(stderr, "kwker chat: /reset clears the conversation, /quit or Ctrl-D exits, "
                        "Ctrl-C stops a reply.\n");
    for (;;) {
        ssize_t n = read_turn(&buf, &cap, tty);
        if (n < 0) {
            if (tty)
                printf("\n");
            break;
        }
        if (n == 0)
            continue;
        if (!strcmp(buf, "/quit") || !strcmp(buf, "/exit"))
            break;
        if (!strcmp(buf, "/reset")) {
            cli_conv_truncate(c, keep);
            fprintf(stderr, "(conversation cleared)\n");
            continue;
        }
        if (cli_conv_add(c, "user", buf)) {
            fprintf(stderr, "kwker chat: the message is not valid UTF-8; say it again\n");
            continue;
        }
        chat_turn(s, c, o, keep);
    }
    free(buf);
    return 0;
}

int cmd_chat(int argc, char **argv)
{
    struct cli_gen_opts o;
    cli_gen_opts_init(&o, -1);
    int rc = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            rc = 0;
            goto out_opts;
        }
        int st = cli_gen_parse(&o, "chat", argc, argv, &i);
        if (st == CLI_OPT_BAD)
            goto out_opts;
        if (st == CLI_OPT_NONE) {
            fprintf(stderr, "kwker chat: unknown option '%s'\n", argv[i]);
            usage(stderr);
            goto out_opts;
        }
    }
    if (cli_gen_finish(&o, "chat"))
        goto out_opts;
    rc = 1;
    struct cli_session s;
    struct cli_conv c;
    if (cli_session_open(&s, &o, 1, "chat"))
        goto out_opts;
    if (cli_conv_init(&c, s.tok, o.chat_template_file, o.chat_template_kwargs, "chat"))
        goto out_session;
    if (o.system && cli_conv_add(&c, "system", o.system)) {
        fprintf(stderr, "kwker chat: --system is not valid UTF-8\n");
        goto out_conv;
    }
    /* no SA_RESTART: a Ctrl-C at the prompt ends getline (and the program) */
    struct sigaction sa, old_sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    rc = chat_loop(&s, &c, &o, o.system ? 1 : 0);
    sigaction(SIGINT, &old_sa, NULL);
out_conv:
    cli_conv_free(&c);
out_session:
    cli_session_close(&s);
out_opts:
    cli_gen_opts_free(&o);
    return rc;
}
