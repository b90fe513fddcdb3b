/* fuzz_model_json.c - libFuzzer target over the small files beside a Hugging Face checkpoint:
 * config.json, generation_config.json, tokenizer_config.json, special_tokens_map.json,
 * chat_template.jinja, the vocabulary files of a folder without tokenizer.json (vocab.json,
 * merges.txt, vocab.txt), and an encoder's sentence-transformers files (modules.json,
 * 1_Pooling/config.json, sentence_bert_config.json). The input is those eleven files in that
 * order, separated by NUL bytes (JSON never holds a raw NUL); an empty or missing piece is an
 * absent file. They are written into a folder of this process's, with a fixed tiny
 * tokenizer.json unless a vocabulary file is given, and read through the real entry points: the
 * model configuration (kwk_config_load_dir; a loaded encoder's sequence limit within its
 * positions) and the tokenizer (kwk_tokenizer_load), which must load or fail with an error,
 * never crash; a loaded tokenizer encodes with its special tokens into ids of its vocabulary,
 * decodes, and its chat template, if any, is compiled and rendered. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "fuzz_roundtrip.h"
#include "kwker.h"
#include "model/model.h"

#define FUZZ_MAX_INPUT (128 * 1024)

static const char *const files[] = {"config.json", "generation_config.json",
                                    "tokenizer_config.json", "special_tokens_map.json",
                                    "chat_template.jinja",   "vocab.json",
                                    "merges.txt",            "vocab.txt",
                                    "modules.json",          "1_Pooling/config.json",
                                    "sentence_bert_config.json"};
/* files[N_CONFIGS .. N_CONFIGS + 2] are vocabularies, which replace tokenizer.json */
#define N_CONFIGS 5
#define N_VOCABS 3

/* Byte-level BPE over "hello world" with two added tokens the configs can name. */
static const char tokenizer_json[] =
    "{\"version\": \"1.0\", \"added_tokens\": ["
    "{\"id\": 12, \"content\": \"<s>\", \"special\": true, \"lstrip\": false, \"rstrip\": false,"
    " \"normalized\": false, \"single_word\": false},"
    "{\"id\": 13, \"content\": \"</s>\", \"special\": true, \"lstrip\": false, \"rstrip\": false,"
    " \"normalized\": false, \"single_word\": false}],"
    " \"normalizer\": null,"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
    " \"use_regex\": true},"
    " \"post_processor\": null, \"decoder\": {\"type\": \"ByteLevel\"},"
    " \"model\": {\"type\": \"BPE\", \"vocab\": {\"h\": 0, \"e\": 1, \"l\": 2, \"o\": 3,"
    " \"\\u0120\": 4, \"w\": 5, \"r\": 6, \"d\": 7, \"he\": 8, \"ll\": 9, \"hell\": 10,"
    " \"hello\": 11}, \"merges\": [\"h e\", \"l l\", \"he ll\", \"hell o\"]}}";

static char dir[4096];

/* The harness's own failures (no folder, a full disk) stop the run: a replay that tested
 * nothing must not pass. */
static void harness_fail(const char *what, const char *path)
{
    fprintf(stderr, "fuzz_model_json: %s %s\n", what, path);
    abort();
}

static void write_file(const char *name, const void *data, size_t n)
{
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        harness_fail("cannot create", path);
    int ok = fwrite(data, 1, n, f) == n;
    if (fclose(f) != 0 || !ok)
        harness_fail("cannot write", path);
}

static void remove_file(const char *name)
{
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

/* The folder, made once a process (removed at exit). */
static void cleanup(void)
{
    for (size_t i = 0; i < KWK_ARRAY_LEN(files); i++)
        remove_file(files[i]);
    remove_file("tokenizer.json");
    char sub[4096 + 16];
    snprintf(sub, sizeof sub, "%s/1_Pooling", dir);
    rmdir(sub);
    rmdir(dir);
}

static void setup(void)
{
    setenv("KWKER_LOG", "error", 0); /* each ignored file would print a warning */
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kwk_fuzz_model_json.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        harness_fail("cannot make the folder", dir);
    char sub[4096 + 16];
    snprintf(sub, sizeof sub, "%s/1_Pooling", dir);
    if (mkdir(sub, 0700))
        harness_fail("cannot make the folder", sub);
    atexit(cleanup);
}

static void use_template(const char *src)
{
    struct kwk_template_opts o;
    kwk_template_opts_init(&o);
    struct kwk_err err;
    kwk_template *t = kwk_template_new(src, strlen(src), &o, &err);
    if (!t)
        return;
    static const char ctx[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"hello\"}],"
                              " \"add_generation_prompt\": true, \"bos_token\": \"<s>\"}";
    struct kwk_render_opts ro; /* fuzz_template's limits: quick runs */
    kwk_render_opts_init(&ro);
    ro.max_steps = 200000;
    ro.max_depth = 40;
    ro.max_output = 1 << 20;
    ro.max_memory = 32 << 20;
    char *out = NULL;
    size_t n = 0;
    if (kwk_template_render(t, ctx, sizeof ctx - 1, &ro, &out, &n, &err) == 0)
        kwk_string_free(out);
    kwk_template_free(t);
}

static void use_tokenizer(const kwk_tokenizer *t)
{
    static const char text[] = "<s>hello world</s>";
    fuzz_roundtrip(t, text, sizeof text - 1);
    /* every id the configs named must be usable as one */
    int32_t named[3 + 8] = {kwk_tokenizer_bos_id(t), kwk_tokenizer_pad_id(t),
                            kwk_tokenizer_unk_id(t)};
    int n_named = 3 + kwk_tokenizer_eos_ids(t, named + 3, 8);
    for (int i = 0; i < n_named; i++)
        if (named[i] < -1 || named[i] >= kwk_tokenizer_n_vocab(t))
            abort(); /* an id outside the vocabulary */
    const char *tokens[] = {kwk_tokenizer_bos_token(t), kwk_tokenizer_eos_token(t)};
    for (size_t i = 0; i < KWK_ARRAY_LEN(tokens); i++)
        if (tokens[i])
            (void)strlen(tokens[i]);
    if (kwk_tokenizer_chat_template(t))
        use_template(kwk_tokenizer_chat_template(t));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > FUZZ_MAX_INPUT)
        return 0;
    if (!dir[0])
        setup();
    const uint8_t *p = data, *end = data + size;
    int legacy = 0;
    for (size_t i = 0; i < KWK_ARRAY_LEN(files); i++) {
        const uint8_t *q = p < end ? memchr(p, 0, (size_t)(end - p)) : NULL;
        const uint8_t *stop = q ? q : end;
        if (stop > p) {
            write_file(files[i], p, (size_t)(stop - p));
            legacy |= i >= N_CONFIGS && i < N_CONFIGS + N_VOCABS;
        } else {
            remove_file(files[i]);
        }
        p = q ? q + 1 : end;
    }
    if (legacy)
        remove_file("tokenizer.json");
    else
        write_file("tokenizer.json", tokenizer_json, sizeof tokenizer_json - 1);
    struct kwk_config cfg;
    struct kwk_err err;
    if (kwk_config_load_dir(&cfg, dir, &err) == 0 && cfg.encoder &&
        !(cfg.max_tokens >= 1 && cfg.max_tokens <= cfg.max_position))
        abort(); /* a limit past the positions, or none */
    kwk_tokenizer *t = kwk_tokenizer_load(dir, &err);
    if (t) {
        use_tokenizer(t);
        kwk_tokenizer_free(t);
    }
    return 0;
}
