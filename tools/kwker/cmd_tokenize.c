/* cmd_tokenize.c - `kwker tokenize`: print the ids and pieces of a text, or decode ids.
 * Main thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kwker.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kwker tokenize --model M [--no-special] [--ids-only] \"text\"\n"
            "       kwker tokenize --model M --decode 1,2,3 [--skip-special]\n"
            "  --model M        folder with tokenizer.json (or legacy files), tokenizer.json,\n"
            "                   a .gguf file, or a Hugging Face id in the local cache\n"
            "  --no-special     do not add the post-processor's tokens (BOS, ...)\n"
            "  --ids-only       print only the ids, comma-separated\n"
            "  --decode IDS     print the text of comma-separated ids\n"
            "  -                read the text from stdin\n");
}

/* Print a piece with control characters escaped, so every piece stays on one line. */
static void print_piece(const char *p, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\r')
            fputs("\\r", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static char *read_stdin(size_t *n)
{
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + len, 1, cap - len, stdin);
        len += got;
        if (got == 0)
            break;
        if (len == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    *n = len;
    return buf;
}

static int decode_ids(kwk_tokenizer *t, const char *list, int skip)
{
    int cap = 1 + (int)strlen(list) / 2;
    int *ids = malloc(sizeof *ids * (size_t)cap);
    int32_t *ids32 = malloc(sizeof *ids32 * (size_t)cap);
    char *text = NULL;
    size_t len = 0;
    int rc = 2, n = ids && ids32 ? cli_parse_ids(list, ids, cap) : -1;
    if (n < 0) {
        fprintf(stderr, "kwker tokenize: bad id list '%s'\n", list);
        goto out;
    }
    for (int i = 0; i < n; i++)
        ids32[i] = ids[i];
    int st = kwk_tokenizer_decode_alloc(t, ids32, (size_t)n, skip, &text, &len);
    if (st) {
        fprintf(stderr, "kwker tokenize: decode: %s\n", kwk_status_str(st));
        rc = 1;
        goto out;
    }
    fwrite(text, 1, len, stdout);
    putchar('\n');
    rc = 0;
out:
    kwk_tokenizer_mem_free(text);
    free(ids);
    free(ids32);
    return rc;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *decode = NULL;
    int special = 1, ids_only = 0, skip = 0, from_stdin = 0, rc = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            model = argv[++i];
        } else if (!strcmp(argv[i], "--decode") && i + 1 < argc) {
            decode = argv[++i];
        } else if (!strcmp(argv[i], "--no-special")) {
            special = 0;
        } else if (!strcmp(argv[i], "--skip-special")) {
            skip = 1;
        } else if (!strcmp(argv[i], "--ids-only")) {
            ids_only = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-")) {
            from_stdin = 1;
        } else if (argv[i][0] == '-' && argv[i][1] == '-') {
            fprintf(stderr, "kwker tokenize: unknown option %s\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            text = argv[i];
        }
    }
    if (!model || (!text && !decode && !from_stdin)) {
        usage(stderr);
        return 2;
    }
    struct kwk_err err;
    kwk_tokenizer *t = kwk_tokenizer_load(model, &err);
    if (!t) {
        fprintf(stderr, "kwker tokenize: %s\n", err.msg);
        return 1;
    }
    if (decode) {
        rc = decode_ids(t, decode, skip);
        kwk_tokenizer_free(t);
        return rc;
    }
    char *in = NULL;
    size_t len = text ? strlen(text) : 0;
    if (from_stdin) {
        in = read_stdin(&len);
        if (!in) {
            fprintf(stderr, "kwker tokenize: cannot read stdin\n");
            goto out;
        }
        text = in;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int st = kwk_tokenizer_encode_alloc(t, text, len, special, &ids, &n);
    if (st) {
        fprintf(stderr, "kwker tokenize: encode: %s\n", kwk_status_str(st));
        goto out;
    }
    if (ids_only) {
        for (size_t i = 0; i < n; i++)
            printf("%s%d", i ? "," : "", (int)ids[i]);
        putchar('\n');
    } else {
        for (size_t i = 0; i < n; i++) {
            size_t pl = 0;
            const char *p = kwk_tokenizer_id_to_piece(t, ids[i], &pl);
            printf("%8d  ", (int)ids[i]);
            print_piece(p ? p : "", p ? pl : 0);
            putchar('\n');
        }
        fprintf(stderr, "%zu tokens\n", n);
    }
    kwk_tokenizer_mem_free(ids);
    rc = 0;
out:
    free(in);
    kwk_tokenizer_free(t);
    return rc;
}
