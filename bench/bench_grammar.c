/* bench_grammar.c - grammar mask time: a JSON grammar (llama.cpp's json.gbnf, by hand) over a
 * real vocabulary (SmolLM2's, 49152 tokens) or synthetic byte strings. For several states it
 * prints the first mask (the DFA around that state still to build), a mask by walking the trie
 * over the built DFA (the matcher's cache of recent masks bypassed), and kwk_matcher_mask as a
 * generation calls it (cache included); then a whole JSON document generated token by token
 * (mask + accept per token). Prints; asserts nothing. Single-threaded.
 * Usage: bench_grammar [tokenizer path | synthetic:N] [repeats] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar.h"
#include "kwker.h"

static const char json_gbnf[] =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
    "[0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? "
    "([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char document[] =
    "{\n  \"name\": \"Kwker benchmark\",\n  \"version\": 3,\n  \"ratio\": -0.125e-2,\n"
    "  \"tags\": [\"fast\", \"small\", \"caf\xc3\xa9\", \"\xe4\xb8\xad\xe6\x96\x87\"],\n"
    "  \"nested\": {\"a\": {\"b\": {\"c\": [1, 2, 3, {\"d\": null}]}}},\n"
    "  \"text\": \"A longer string value, the kind a model writes when it explains something "
    "in a field of a JSON object: several words, punctuation, and \\\"escapes\\\" too.\",\n"
    "  \"ok\": true\n}";

/* N tokens: the 256 bytes, then random strings of 2..9 bytes, some with UTF-8 characters. */
static kwk_grammar_vocab *synthetic_vocab(int N)
{
    static const char alphabet[] = " etaoinshrdlucmfwypvbgkqjxz{}[]\":,.0123456789-_\n\\"
                                   "\xc3\xa9\xe4\xb8\xad";
    char **bytes = malloc((size_t)N * sizeof *bytes);
    uint32_t *lens = malloc((size_t)N * sizeof *lens);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        lens[i] = i < 256 ? 1 : 2 + (uint32_t)(x % 8);
        bytes[i] = malloc(lens[i]);
        for (uint32_t k = 0; k < lens[i]; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            bytes[i][k] = i < 256 ? (char)i : alphabet[x % (sizeof alphabet - 1)];
        }
    }
    struct kwk_err err;
    kwk_grammar_vocab *v = kwk_grammar_vocab_from_bytes((const char *const *)bytes, lens, N, &err);
    for (int i = 0; i < N; i++)
        free(bytes[i]);
    free(bytes);
    free(lens);
    return v;
}

struct state_case {
    const char *name;
    const char *prefix;
};

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int reps = argc > 2 ? atoi(argv[2]) : 200;
    struct kwk_err err;
    int n_synth = strncmp(path, "synthetic:", 10) ? 49152 : atoi(path + 10);
    kwk_tokenizer *tok = n_synth == 49152 ? kwk_tokenizer_load(path, &err) : NULL;
    double t0 = kwk_time_s();
    kwk_grammar_vocab *v = tok ? kwk_grammar_vocab_new(tok, &err) : synthetic_vocab(n_synth);
    double t_vocab = kwk_time_s() - t0;
    if (!v) {
        fprintf(stderr, "bench_grammar: vocab: %s\n", err.msg);
        return 1;
    }
    printf("vocabulary: %s, %d tokens, %u trie nodes, built in %.1f ms\n",
           tok ? path : "synthetic", kwk_grammar_vocab_size(v), v->n_nodes, t_vocab * 1e3);
    t0 = kwk_time_s();
    kwk_grammar *g = kwk_grammar_new(json_gbnf, strlen(json_gbnf), &err);
    if (!g) {
        fprintf(stderr, "bench_grammar: grammar: %s\n", err.msg);
        return 1;
    }
    printf("grammar: JSON, %u elements, %u rules, %u byte classes, compiled in %.3f ms\n",
           g->n_elems, g->n_rules, g->n_classes, (kwk_time_s() - t0) * 1e3);
    static const struct state_case cases[] = {
        {"start", ""},
        {"inside a string", "{\"na"},
        {"after a key", "{\"name\": "},
        {"inside a number", "{\"n\": 12"},
        {"string, depth 6", "{\"a\": [{\"b\": [[{\"c\": \"x"},
        {"mid-character", "{\"a\": \"\xe4\xb8"},
    };
    size_t words = ((size_t)kwk_grammar_vocab_size(v) + 31) / 32;
    uint32_t *mask = malloc(words * sizeof *mask);
    printf("%-18s %8s %10s %10s %10s\n", "state", "allowed", "first ms", "walk ms", "mask ms");
    for (size_t c = 0; c < KWK_ARRAY_LEN(cases); c++) {
        kwk_matcher *m = kwk_matcher_new(g, v, &err);
        if (!m || kwk_matcher_accept_bytes(m, cases[c].prefix, strlen(cases[c].prefix))) {
            fprintf(stderr, "bench_grammar: %s: cannot reach the state\n", cases[c].name);
            return 1;
        }
        t0 = kwk_time_s();
        int32_t n = kg_matcher_mask_walk(m, mask);
        double first = kwk_time_s() - t0;
        t0 = kwk_time_s();
        for (int r = 0; r < reps; r++)
            kg_matcher_mask_walk(m, mask);
        double walk = (kwk_time_s() - t0) / reps;
        t0 = kwk_time_s();
        for (int r = 0; r < reps; r++)
            kwk_matcher_mask(m, mask);
        double cached = (kwk_time_s() - t0) / reps;
        printf("%-18s %8d %10.3f %10.4f %10.4f\n", cases[c].name, n, first * 1e3, walk * 1e3,
               cached * 1e3);
        kwk_matcher_free(m);
    }
    if (tok) {
        /* Generation: the document's tokens, each a mask then an accept. */
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (kwk_tokenizer_encode_alloc(tok, document, sizeof document - 1, 0, &ids, &n_ids) == 0) {
            for (int pass = 0; pass < 2; pass++) {
                kwk_matcher *m = kwk_matcher_new(g, v, &err);
                double tm = 0, worst = 0;
                t0 = kwk_time_s();
                for (size_t i = 0; i < n_ids; i++) {
                    double a = kwk_time_s();
                    kwk_matcher_mask(m, mask);
                    double d = kwk_time_s() - a;
                    tm += d;
                    worst = d > worst ? d : worst;
                    if (kwk_matcher_accept(m, ids[i])) {
                        fprintf(stderr, "bench_grammar: token %zu refused\n", i);
                        break;
                    }
                }
                double total = kwk_time_s() - t0;
                size_t n_states;
                size_t bytes = kg_matcher_bytes(m, &n_states);
                printf("generation (%s matcher): %zu tokens, mask %.4f ms mean, %.3f ms worst; "
                       "mask+accept %.4f ms/token; %zu DFA states, %.1f KiB of tables\n",
                       pass ? "second" : "new", n_ids, tm * 1e3 / (double)n_ids, worst * 1e3,
                       total * 1e3 / (double)n_ids, n_states, (double)bytes / 1024);
                kwk_matcher_free(m);
            }
            kwk_tokenizer_mem_free(ids);
        }
    }
    free(mask);
    kwk_grammar_free(g);
    kwk_grammar_vocab_free(v);
    kwk_tokenizer_free(tok);
    return 0;
}
