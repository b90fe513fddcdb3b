/* test_seq_limit.c - an encoder folder's sequence limit (seq_limit.c) through kwk_config_load_dir:
 * sentence_bert_config.json's max_seq_length in a sentence-transformers folder, else
 * tokenizer_config.json's model_max_length, never above the positions; values that are not a
 * positive whole number, files that are not JSON objects, leave the positions. The expected
 * limits are sentence-transformers 6's rule (Transformer.__init__ / load_config) worked by hand. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "test.h"

static char root[256];

static void write_text(const char *dir, const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    T_CHECK(f != NULL, "cannot write %s", path);
    if (!f)
        return;
    fputs(text, f);
    fclose(f);
}

/* 128 positions for BERT; RoBERTa's 130 less pad_token_id 1 + 1 */
#define BERT_CONFIG(pos, extra)                                                                  \
    "{\"architectures\":[\"BertModel\"]," extra "\"vocab_size\":32,\"hidden_size\":8,"          \
    "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"intermediate_size\":16,"               \
    "\"max_position_embeddings\":" pos "}"

static const char modules_json[] =
    "[{\"idx\":0,\"name\":\"0\",\"path\":\"\",\"type\":\"sentence_transformers.models."
    "Transformer\"},{\"idx\":1,\"name\":\"1\",\"path\":\"1_Pooling\",\"type\":"
    "\"sentence_transformers.models.Pooling\"}]";

struct limit_case {
    const char *name;
    int st_folder;    /* modules.json and 1_Pooling/config.json written */
    const char *sbc;  /* sentence_bert_config.json's text, NULL: no file */
    const char *tok;  /* tokenizer_config.json's text, NULL: no file */
    int want_st, want_tok, want_max;
};

static const struct limit_case cases[] = {
    {"none", 1, NULL, NULL, 0, 0, 128},
    {"st_40", 1, "{\"max_seq_length\": 40, \"do_lower_case\": false}",
     "{\"model_max_length\": 512}", 40, 512, 40},
    /* sentence-transformers builds a folder without modules.json afresh: its file is unread */
    {"plain_st_40", 0, "{\"max_seq_length\": 40}", "{\"model_max_length\": 512}", 0, 512, 128},
    {"plain_tok_48", 0, NULL, "{\"model_max_length\": 48}", 0, 48, 48},
    /* transformers' older key, read only when model_max_length is not in the file */
    {"tok_max_len_48", 0, NULL, "{\"max_len\": 48}", 0, 48, 48},
    {"tok_both", 0, NULL, "{\"model_max_length\": 60, \"max_len\": 48}", 0, 60, 60},
    {"tok_null_max_len", 0, NULL, "{\"model_max_length\": null, \"max_len\": 48}", 0, 0, 128},
    {"st_null_tok_48", 1, "{\"max_seq_length\": null}", "{\"model_max_length\": 48}", 0, 48, 48},
    {"st_none_tok_48", 1, "{\"do_lower_case\": false}", "{\"model_max_length\": 48}", 0, 48, 48},
    /* max_seq_length wins over the tokenizer's, even above the positions */
    {"st_1000_tok_48", 1, "{\"max_seq_length\": 1000}", "{\"model_max_length\": 48}", 1000, 48,
     128},
    {"st_1", 1, "{\"max_seq_length\": 1}", NULL, 1, 0, 1},
    {"st_whole_real", 1, "{\"max_seq_length\": 40.0}", NULL, 40, 0, 40},
    {"st_2e31", 1, "{\"max_seq_length\": 2147483648}", NULL, INT32_MAX, 0, 128},
    /* transformers' VERY_LARGE_INTEGER, int(1e30), more than jansson's integers hold */
    {"tok_1e30", 0, NULL, "{\"model_max_length\": 1000000000000000019884624838656}", 0,
     INT32_MAX, 128},
    {"tok_1e30_real", 0, NULL, "{\"model_max_length\": 1e30}", 0, INT32_MAX, 128},
    /* not a positive whole number: as if absent */
    {"st_string", 1, "{\"max_seq_length\": \"40\"}", "{\"model_max_length\": 48}", 0, 48, 48},
    {"st_negative", 1, "{\"max_seq_length\": -40}", NULL, 0, 0, 128},
    {"st_zero", 1, "{\"max_seq_length\": 0}", NULL, 0, 0, 128},
    {"st_fraction", 1, "{\"max_seq_length\": 40.5}", NULL, 0, 0, 128},
    {"st_tiny", 1, "{\"max_seq_length\": 0.5}", NULL, 0, 0, 128},
    {"st_bool", 1, "{\"max_seq_length\": true}", NULL, 0, 0, 128},
    {"tok_list", 0, NULL, "{\"model_max_length\": [48]}", 0, 0, 128},
    {"tok_object", 0, NULL, "{\"model_max_length\": {\"v\": 48}}", 0, 0, 128},
    {"tok_negative_huge", 0, NULL, "{\"model_max_length\": -1e300}", 0, 0, 128},
    /* files jansson refuses or that are not objects: ignored whole */
    {"st_nan", 1, "{\"max_seq_length\": NaN}", "{\"model_max_length\": 48}", 0, 48, 48},
    {"st_overflow", 1, "{\"max_seq_length\": 1e999}", "{\"model_max_length\": 48}", 0, 48, 48},
    {"st_truncated", 1, "{\"max_seq_length\": 40", "{\"model_max_length\": 48}", 0, 48, 48},
    {"tok_array", 0, NULL, "[{\"model_max_length\": 48}]", 0, 0, 128},
    {"tok_empty", 0, NULL, "", 0, 0, 128},
};

static void load_case(const struct limit_case *c, const char *config, struct kwk_config *cfg)
{
    char dir[512], sub[600];
    snprintf(dir, sizeof dir, "%s/%s", root, c->name);
    mkdir(dir, 0755);
    write_text(dir, "config.json", config);
    if (c->st_folder) {
        write_text(dir, "modules.json", modules_json);
        snprintf(sub, sizeof sub, "%s/1_Pooling", dir);
        mkdir(sub, 0755);
        write_text(dir, "1_Pooling/config.json", "{\"pooling_mode_mean_tokens\": true}");
    }
    if (c->sbc)
        write_text(dir, "sentence_bert_config.json", c->sbc);
    if (c->tok)
        write_text(dir, "tokenizer_config.json", c->tok);
    struct kwk_err err;
    memset(cfg, 0, sizeof *cfg);
    int rc = kwk_config_load_dir(cfg, dir, &err);
    T_CHECK(rc == 0, "%s: %s", c->name, err.msg);
    T_CHECK(cfg->unsupported[0] == '\0', "%s: %s", c->name, cfg->unsupported);
}

static void test_cases(void)
{
    for (size_t i = 0; i < KWK_ARRAY_LEN(cases); i++) {
        const struct limit_case *c = &cases[i];
        struct kwk_config cfg;
        load_case(c, BERT_CONFIG("128", ""), &cfg);
        T_CHECK(cfg.max_position == 128, "%s: positions %d", c->name, cfg.max_position);
        T_CHECK(cfg.st_max_seq_length == c->want_st, "%s: max_seq_length %d, want %d", c->name,
                cfg.st_max_seq_length, c->want_st);
        T_CHECK(cfg.tok_max_length == c->want_tok, "%s: model_max_length %d, want %d", c->name,
                cfg.tok_max_length, c->want_tok);
        T_CHECK(cfg.max_tokens == c->want_max, "%s: max_tokens %d, want %d", c->name,
                cfg.max_tokens, c->want_max);
        T_EQ(kwk_config_max_tokens(&cfg), c->want_max);
    }
}

/* RoBERTa's positions are max_position_embeddings less pad_token_id + 1: its tokenizer's 512
 * (roberta-base's own numbers: 514 and 512) is the whole of them, 514 is cut to them. */
static void test_roberta(void)
{
    static const struct {
        const char *name, *tok;
        int want;
    } rc[] = {
        {"roberta_512", "{\"model_max_length\": 512}", 512},
        {"roberta_514", "{\"model_max_length\": 514}", 512},
        {"roberta_100", "{\"model_max_length\": 100}", 100},
    };
    for (size_t i = 0; i < KWK_ARRAY_LEN(rc); i++) {
        struct limit_case c = {rc[i].name, 0, NULL, rc[i].tok, 0, 0, 0};
        struct kwk_config cfg;
        load_case(&c, BERT_CONFIG("514", "\"model_type\":\"roberta\",\"pad_token_id\":1,"),
                  &cfg);
        T_EQ(cfg.max_position, 512);
        T_CHECK(cfg.max_tokens == rc[i].want, "%s: max_tokens %d, want %d", rc[i].name,
                cfg.max_tokens, rc[i].want);
    }
}

/* tokenizer_config.json may be large (a long added_tokens_decoder): read up to the tokenizer's
 * own bound, past sentence-transformers' small files' one. */
static void test_large_tokenizer_config(void)
{
    size_t pad = (size_t)3 << 20;
    char *text = malloc(pad + 64);
    T_TRUE(text != NULL);
    if (!text)
        return;
    int n = snprintf(text, 64, "{\"model_max_length\": 48, \"pad\": \"");
    memset(text + n, 'x', pad);
    memcpy(text + n + pad, "\"}", 3);
    struct limit_case c = {"tok_large", 0, NULL, text, 0, 48, 48};
    struct kwk_config cfg;
    load_case(&c, BERT_CONFIG("128", ""), &cfg);
    T_EQ(cfg.tok_max_length, 48);
    T_EQ(cfg.max_tokens, 48);
    free(text);
}

/* A configuration not read from files (max_tokens 0), and a stale max_tokens past the
 * positions: the positions. */
static void test_max_tokens_default(void)
{
    struct kwk_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.max_position = 64;
    T_EQ(kwk_config_max_tokens(&cfg), 64);
    cfg.max_tokens = 100;
    T_EQ(kwk_config_max_tokens(&cfg), 64);
    cfg.max_tokens = 10;
    T_EQ(kwk_config_max_tokens(&cfg), 10);
}

int main(void)
{
    setenv("KWKER_LOG", "error", 0); /* each ignored value is warned about */
    snprintf(root, sizeof root, "/tmp/kwk_test_seq_limit_%d", (int)getpid());
    mkdir(root, 0755);
    test_cases();
    test_roberta();
    test_large_tokenizer_config();
    test_max_tokens_default();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return t_report("test_seq_limit");
}
