/* main.c - kwker: dispatch to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kwker.h"

struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
};


static const struct command commands[] = {
    {"generate", cmd_generate, "generate from ids, a prompt or a chat message (streamed)"},
    {"bench", cmd_bench, "measure prompt and generation tokens/s"},
    {"check", cmd_check, "say whether a model can run, and why not"},
    {"template", cmd_template, "render a model's chat template over a conversation"},
    {"tokenize", cmd_tokenize, "print the token ids and pieces of a text (or decode ids)"},
    {"perplexity", cmd_perplexity, "perplexity of a text file, llama.cpp's protocol"},
    {"chat", cmd_chat, "chat on the terminal with a model's chat template, streaming"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server (continuous batching)"},
    {"embed", cmd_embed, "embeddings of texts from an embedding model (JSON arrays)"},
    {"rerank", cmd_rerank, "documents ordered by relevance to a query (a reranker)"},
    /* KWK_CLI_COMMANDS: subcommands from other modules are listed here */
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kwker <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nkwker <command> --help for a command's options. KWKER_ISA=scalar|avx2|avx512 "
               "forces a kernel path.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("kwker %d.%d.%d\n", KWK_VERSION_MAJOR, KWK_VERSION_MINOR, KWK_VERSION_PATCH);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kwker: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
