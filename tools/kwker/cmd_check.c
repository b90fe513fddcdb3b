/* cmd_check.c - kwker check: whether a model can run, and the one-line reason when not. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cmd_check(int argc, char **argv)
{
    const char *model = NULL;
    int max_len = 2048;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--max-cache-len") &&
                 cli_parse_int(argv[i + 1], 1, 1 << 24, &max_len) == 0)
            continue;
        else
            model = NULL, i = argc;
    }
    if (!model) {
        fprintf(stderr, "usage: kwker check --model M [--max-cache-len N]\n");
        return 2;
    }
    char reason[512];
    if (kwk_model_check(model, max_len, reason, sizeof reason) != 0) {
        printf("unsupported: %s\n", reason);
        return 1;
    }
    printf("ok: %s runs with a cache of %d positions\n", model, max_len);
    return 0;
}
