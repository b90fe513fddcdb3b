/* cli.h - the kwker command-line program: one function per subcommand, one file each. */
#ifndef KWK_CLI_H
#define KWK_CLI_H

#include "kwker.h"

/* Each subcommand gets argv with argv[0] = subcommand name; returns the process exit code. */
int cmd_generate(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);

/* Parse a comma-separated id list into ids[cap]; returns the count or -1 on a bad list. */
int cli_parse_ids(const char *s, int *ids, int cap);

/* Parse an integer in [lo, hi]; -1 when s is not one. */
int cli_parse_int(const char *s, int lo, int hi, int *out);
/* enum kwk_precision for "preserve" | "balanced" | "int8" | "int4", or -1. */
int cli_parse_precision(const char *s);
/* The packed-weight cache directory for --cache-dir v (NULL when the option is absent): "off"
 * means none (NULL); absent, $KWKER_CACHE ("" or "off": none) or else ~/.cache/kwker/packs.
 * The cache only matters for --precision balanced / int8 / int4. */
const char *cli_cache_dir(const char *v);

#endif
