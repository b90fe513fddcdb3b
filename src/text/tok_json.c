/* tok_json.c - reads a tokenizer.json (Hugging Face tokenizers serialization) into a
 * kwk_tokenizer: model (BPE, WordPiece, Unigram, WordLevel), normalizer, pre-tokenizer,
 * post-processor, decoder and added tokens. Called by the loader; any thread. */
#include <errno.h>
#include <limits.h>
#include <string.h>

#include <jansson.h>

#include "text/tokenizer.h"

#define GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define WHITESPACE_REGEX "\\w+|[^\\w\\s]+"

struct jctx {
    struct kwk_tokenizer *t;
    const char *label;
    struct kwk_err *err;
};

static const char *jstr(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int jbool(json_t *o, const char *key, int dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* An integer option, clamped to int's range (past it, a bound means no bound). */
static int jint(json_t *o, const char *key, int dflt)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        return dflt;
    json_int_t x = json_integer_value(v);
    return x > INT_MAX ? INT_MAX : x < INT_MIN ? INT_MIN : (int)x;
}

/* A token id: -1 unless an integer in [0, TOK_MAX_VOCAB) (checked before the cast could wrap
 * it into range). */
static int32_t jid(json_t *v)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= TOK_MAX_VOCAB)
        return -1;
    return (int32_t)json_integer_value(v);
}

static char *dup_n(const char *s, size_t n)
{
    char *p = kwk_malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static int bad(struct jctx *c, const char *what)
{
    return kwk_err_set(c->err, KWK_EFORMAT, "%s: %s", c->label, what);
}

/* pattern: {"String": "..."} or {"Regex": "..."} */
static int parse_pattern(struct jctx *c, json_t *pat, struct tok_step *st)
{
    const char *s;
    if ((s = jstr(pat, "String"))) {
        st->pat_len = json_string_length(json_object_get(pat, "String"));
        st->pat = dup_n(s, st->pat_len);
        return st->pat ? 0 : -ENOMEM;
    }
    if ((s = jstr(pat, "Regex"))) {
        size_t n = json_string_length(json_object_get(pat, "Regex"));
        return tok_compile_regex(&st->re, s, n, c->err);
    }
    if (json_is_string(pat)) {
        st->pat_len = json_string_length(pat);
        st->pat = dup_n(json_string_value(pat), st->pat_len);
        return st->pat ? 0 : -ENOMEM;
    }
    return bad(c, "pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

static int set_content(struct tok_step *st, const char *s)
{
    st->content_len = strlen(s);
    st->content = dup_n(s, st->content_len);
    return st->content ? 0 : -ENOMEM;
}

static int parse_step(struct jctx *c, json_t *o, struct tok_step *st, int family);

static int parse_seq(struct jctx *c, json_t *arr, struct tok_step *st, int family, int kind)
{
    st->kind = kind;
    if (!json_is_array(arr))
        return bad(c, "Sequence without its list");
    size_t n = json_array_size(arr);
    st->subs = kwk_calloc(n ? n : 1, sizeof *st->subs);
    if (!st->subs)
        return -ENOMEM;
    st->n_subs = (int)n;
    for (size_t i = 0; i < n; i++) {
        int rc = parse_step(c, json_array_get(arr, i), &st->subs[i], family);
        if (rc)
            return rc;
    }
    return 0;
}

static int behavior(const char *s)
{
    if (!s || !strcmp(s, "Isolated"))
        return TOK_SPLIT_ISOLATED;
    if (!strcmp(s, "Removed"))
        return TOK_SPLIT_REMOVED;
    if (!strcmp(s, "MergedWithPrevious"))
        return TOK_SPLIT_PREV;
    if (!strcmp(s, "MergedWithNext"))
        return TOK_SPLIT_NEXT;
    if (!strcmp(s, "Contiguous"))
        return TOK_SPLIT_CONTIGUOUS;
    return -1;
}

static int prepend_scheme(json_t *o)
{
    const char *ps = jstr(o, "prepend_scheme");
    if (ps)
        return !strcmp(ps, "first") ? TOK_PREPEND_FIRST
               : !strcmp(ps, "never") ? TOK_PREPEND_NEVER : TOK_PREPEND_ALWAYS;
    return jbool(o, "add_prefix_space", 1) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
}

enum { FAM_NORM, FAM_PRE, FAM_DEC, FAM_POST };

static int parse_norm(struct jctx *c, json_t *o, const char *type, struct tok_step *st)
{
    static const struct { const char *name; int kind; } simple[] = {
        {"NFC", TOK_N_NFC}, {"NFD", TOK_N_NFD}, {"NFKC", TOK_N_NFKC}, {"NFKD", TOK_N_NFKD},
        {"Lowercase", TOK_N_LOWER}, {"StripAccents", TOK_N_STRIP_ACCENTS}};
    for (size_t i = 0; i < KWK_ARRAY_LEN(simple); i++)
        if (!strcmp(type, simple[i].name)) {
            st->kind = simple[i].kind;
            return 0;
        }
    if (!strcmp(type, "Sequence"))
        return parse_seq(c, json_object_get(o, "normalizers"), st, FAM_NORM, TOK_N_SEQ);
    if (!strcmp(type, "Replace")) {
        st->kind = TOK_N_REPLACE;
        const char *content = jstr(o, "content");
        if (!content)
            return bad(c, "Replace without content");
        int rc = set_content(st, content);
        return rc ? rc : parse_pattern(c, json_object_get(o, "pattern"), st);
    }
    if (!strcmp(type, "Prepend")) {
        const char *p = jstr(o, "prepend");
        if (!p)
            return bad(c, "Prepend without prepend");
        st->kind = TOK_N_PREPEND;
        st->pat_len = strlen(p);
        st->pat = dup_n(p, st->pat_len);
        return st->pat ? 0 : -ENOMEM;
    }
    if (!strcmp(type, "Strip")) {
        st->kind = TOK_N_STRIP;
        st->left = jbool(o, "strip_left", 1);
        st->right = jbool(o, "strip_right", 1);
        return 0;
    }
    if (!strcmp(type, "BertNormalizer")) {
        st->kind = TOK_N_BERT;
        st->clean_text = jbool(o, "clean_text", 1);
        st->chinese = jbool(o, "handle_chinese_chars", 1);
        st->lowercase = jbool(o, "lowercase", 1);
        json_t *sa = json_object_get(o, "strip_accents");
        st->strip_accents = json_is_boolean(sa) ? json_is_true(sa) : -1;
        return 0;
    }
    if (!strcmp(type, "Precompiled")) {
        json_t *cm = json_object_get(o, "precompiled_charsmap");
        st->kind = TOK_N_PRECOMPILED;
        if (json_is_null(cm) || (json_is_string(cm) && json_string_length(cm) == 0)) {
            st->kind = TOK_NONE; /* an empty charsmap normalizes nothing */
            return 0;
        }
        if (!json_is_string(cm))
            return bad(c, "Precompiled without precompiled_charsmap");
        return tok_precompiled_init(st, json_string_value(cm), json_string_length(cm), c->err);
    }
    return kwk_err_set(c->err, KWK_EUNSUPPORTED, "%s: normalizer %s is not supported", c->label,
                       type);
}

static int parse_pre(struct jctx *c, json_t *o, const char *type, struct tok_step *st)
{
    int rc;
    if (!strcmp(type, "Sequence"))
        return parse_seq(c, json_object_get(o, "pretokenizers"), st, FAM_PRE, TOK_P_SEQ);
    if (!strcmp(type, "ByteLevel")) {
        st->kind = TOK_P_BYTELEVEL;
        st->add_prefix_space = jbool(o, "add_prefix_space", 1);
        st->use_regex = jbool(o, "use_regex", 1);
        c->t->byte_level = 1;
        if (st->use_regex)
            return tok_compile_regex(&st->re, GPT2_REGEX, strlen(GPT2_REGEX), c->err);
        return 0;
    }
    if (!strcmp(type, "Split")) {
        st->kind = TOK_P_SPLIT;
        st->behavior = behavior(jstr(o, "behavior"));
        if (st->behavior < 0)
            return bad(c, "Split has an unknown behavior");
        st->invert = jbool(o, "invert", 0);
        return parse_pattern(c, json_object_get(o, "pattern"), st);
    }
    if (!strcmp(type, "Metaspace")) {
        st->kind = TOK_P_METASPACE;
        const char *r = jstr(o, "replacement");
        st->prepend_scheme = prepend_scheme(o);
        st->split = jbool(o, "split", 1);
        return set_content(st, r ? r : "\xE2\x96\x81");
    }
    if (!strcmp(type, "BertPreTokenizer")) {
        /* Whitespace removed, then every punctuation character isolated. */
        st->kind = TOK_P_SEQ;
        st->subs = kwk_calloc(2, sizeof *st->subs);
        if (!st->subs)
            return -ENOMEM;
        st->n_subs = 2;
        st->subs[0].kind = TOK_P_WSPLIT;
        st->subs[1].kind = TOK_P_PUNCT;
        st->subs[1].behavior = TOK_SPLIT_ISOLATED;
        return 0;
    }
    if (!strcmp(type, "Whitespace")) {
        st->kind = TOK_P_SPLIT;
        st->behavior = TOK_SPLIT_REMOVED;
        st->invert = 1;
        return tok_compile_regex(&st->re, WHITESPACE_REGEX, strlen(WHITESPACE_REGEX), c->err);
    }
    if (!strcmp(type, "WhitespaceSplit")) {
        st->kind = TOK_P_WSPLIT;
        return 0;
    }
    if (!strcmp(type, "Punctuation")) {
        st->kind = TOK_P_PUNCT;
        st->behavior = behavior(jstr(o, "behavior"));
        return st->behavior < 0 ? bad(c, "Punctuation has an unknown behavior") : 0;
    }
    if (!strcmp(type, "Digits")) {
        st->kind = TOK_P_DIGITS;
        st->individual = jbool(o, "individual_digits", 0);
        return 0;
    }
    rc = kwk_err_set(c->err, KWK_EUNSUPPORTED, "%s: pre-tokenizer %s is not supported", c->label,
                     type);
    return rc;
}

static int parse_dec(struct jctx *c, json_t *o, const char *type, struct tok_step *st)
{
    if (!strcmp(type, "Sequence"))
        return parse_seq(c, json_object_get(o, "decoders"), st, FAM_DEC, TOK_D_SEQ);
    if (!strcmp(type, "ByteLevel")) {
        st->kind = TOK_D_BYTELEVEL;
        return 0;
    }
    if (!strcmp(type, "ByteFallback")) {
        st->kind = TOK_D_BYTEFALLBACK;
        return 0;
    }
    if (!strcmp(type, "Fuse")) {
        st->kind = TOK_D_FUSE;
        return 0;
    }
    if (!strcmp(type, "Metaspace")) {
        const char *r = jstr(o, "replacement");
        st->kind = TOK_D_METASPACE;
        st->prepend_scheme = prepend_scheme(o);
        return set_content(st, r ? r : "\xE2\x96\x81");
    }
    if (!strcmp(type, "Strip")) {
        const char *s = jstr(o, "content");
        st->kind = TOK_D_STRIP;
        st->left = jint(o, "start", 0);
        st->right = jint(o, "stop", 0);
        return set_content(st, s ? s : " ");
    }
    if (!strcmp(type, "Replace")) {
        const char *content = jstr(o, "content");
        st->kind = TOK_D_REPLACE;
        if (!content)
            return bad(c, "Replace without content");
        int rc = set_content(st, content);
        return rc ? rc : parse_pattern(c, json_object_get(o, "pattern"), st);
    }
    if (!strcmp(type, "WordPiece")) {
        const char *p = jstr(o, "prefix");
        st->kind = TOK_D_WORDPIECE;
        st->cleanup = jbool(o, "cleanup", 1);
        return set_content(st, p ? p : "##");
    }
    return kwk_err_set(c->err, KWK_EUNSUPPORTED, "%s: decoder %s is not supported", c->label,
                       type);
}

/* A token given as ["[CLS]", 101] (Bert/Roberta processing). */
static int32_t pair_id(json_t *v)
{
    return jid(json_array_get(v, 1));
}

/* BertProcessing: [CLS] A [SEP] B [SEP], B's part type 1. RobertaProcessing: <s> A </s> </s> B
 * </s>, all type 0 (as tokenizers gives them: RoBERTa has no token types). */
static int cls_sep_forms(struct tok_step *st, int32_t cls, int32_t sep, int roberta)
{
    const struct tok_piece bert[] = {{cls, 0}, {TOK_PAIR_A, 0}, {sep, 0}, {TOK_PAIR_B, 1},
                                     {sep, 1}};
    const struct tok_piece rob[] = {{cls, 0}, {TOK_PAIR_A, 0}, {sep, 0}, {sep, 0},
                                    {TOK_PAIR_B, 0}, {sep, 0}};
    const struct tok_piece *p = roberta ? rob : bert;
    int n = roberta ? (int)KWK_ARRAY_LEN(rob) : (int)KWK_ARRAY_LEN(bert);
    st->kind = TOK_PP_TEMPLATE;
    st->tmpl = kwk_malloc(3 * sizeof *st->tmpl);
    st->pair = kwk_malloc((size_t)n * sizeof *st->pair);
    if (!st->tmpl || !st->pair)
        return -ENOMEM;
    st->tmpl[0] = cls;
    st->tmpl[1] = -1;
    st->tmpl[2] = sep;
    st->n_tmpl = 3;
    memcpy(st->pair, p, (size_t)n * sizeof *p);
    st->n_pair = n;
    return 0;
}

/* Pieces one TemplateProcessing list may expand to (its specials' ids included). Real
 * templates have a handful; without a bound a 1 MB file could name a 20,000-id special 5,000
 * times, and every encode would add those 10^8 ids again. */
#define TOK_TEMPLATE_MAX_PIECES 4096

static int push_piece(struct tok_piece **v, int *n, size_t *cap, int32_t id, int32_t type_id)
{
    if (*n >= TOK_TEMPLATE_MAX_PIECES)
        return KWK_ELIMIT;
    if ((size_t)*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        struct tok_piece *p = kwk_realloc(*v, nc * sizeof *p);
        if (!p)
            return -ENOMEM;
        *v = p;
        *cap = nc;
    }
    (*v)[(*n)++] = (struct tok_piece){id, type_id};
    return 0;
}

/* One TemplateProcessing list: {"SpecialToken": {"id": name, "type_id": k}} expands to the
 * special's ids, {"Sequence": {"id": "A" or "B", "type_id": k}} to a text. In the single
 * list every sequence is the one text (TOK_PAIR_A). */
static int parse_template_list(struct jctx *c, json_t *list, json_t *specials, int single,
                               struct tok_piece **out, int *n_out)
{
    size_t cap = 0;
    *out = NULL;
    *n_out = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *it = json_array_get(list, i), *sp = json_object_get(it, "SpecialToken");
        json_t *sq = json_object_get(it, "Sequence");
        json_int_t ty = json_integer_value(json_object_get(sp ? sp : sq, "type_id"));
        if (ty < 0 || ty > INT32_MAX)
            return bad(c, "TemplateProcessing has a type_id out of range");
        int rc = 0;
        if (sp) {
            json_t *def = json_object_get(specials, jstr(sp, "id") ? jstr(sp, "id") : "");
            json_t *ids = json_object_get(def, "ids");
            if (!json_is_array(ids))
                return bad(c, "TemplateProcessing names an undefined special token");
            for (size_t k = 0; k < json_array_size(ids) && !rc; k++) {
                int32_t id = jid(json_array_get(ids, k));
                if (id < 0)
                    return bad(c, "TemplateProcessing has an id out of range (0 to 2^24 - 1)");
                rc = push_piece(out, n_out, &cap, id, (int32_t)ty);
            }
        } else {
            const char *name = jstr(sq, "id");
            int b = name && !strcmp(name, "B");
            if (!single && !b && !(name && !strcmp(name, "A")))
                return bad(c, "TemplateProcessing pair has a sequence other than A and B");
            rc = push_piece(out, n_out, &cap, single || !b ? TOK_PAIR_A : TOK_PAIR_B,
                            (int32_t)ty);
        }
        if (rc == KWK_ELIMIT)
            return bad(c, "TemplateProcessing expands to more than 4096 tokens");
        if (rc)
            return rc;
    }
    return 0;
}

static int parse_template(struct jctx *c, json_t *o, struct tok_step *st)
{
    json_t *single = json_object_get(o, "single"), *pair = json_object_get(o, "pair");
    json_t *specials = json_object_get(o, "special_tokens");
    struct tok_piece *p = NULL;
    int n = 0;
    if (!json_is_array(single))
        return bad(c, "TemplateProcessing without single");
    st->kind = TOK_PP_TEMPLATE;
    int rc = parse_template_list(c, single, specials, 1, &p, &n);
    if (!rc && !(st->tmpl = kwk_malloc((size_t)(n ? n : 1) * sizeof *st->tmpl)))
        rc = -ENOMEM;
    for (int i = 0; !rc && i < n; i++)
        st->tmpl[i] = p[i].id;
    st->n_tmpl = rc ? 0 : n;
    kwk_free(p);
    /* Hugging Face refuses a file without "pair"; here the single form still works and
     * kwk_tokenizer_encode_pair says it has no pair form. */
    if (!rc && json_is_array(pair)) {
        rc = parse_template_list(c, pair, specials, 0, &st->pair, &st->n_pair);
        if (!rc && !st->pair && !(st->pair = kwk_malloc(sizeof *st->pair)))
            rc = -ENOMEM; /* an empty pair list is a pair form: nothing at all */
    }
    return rc;
}

static int parse_post(struct jctx *c, json_t *o, const char *type, struct tok_step *st)
{
    if (!strcmp(type, "Sequence"))
        return parse_seq(c, json_object_get(o, "processors"), st, FAM_POST, TOK_PP_SEQ);
    if (!strcmp(type, "ByteLevel")) {
        st->kind = TOK_PP_NOOP;
        return 0;
    }
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        int32_t cls = pair_id(json_object_get(o, "cls")), sep = pair_id(json_object_get(o, "sep"));
        if (cls < 0 || sep < 0)
            return bad(c, "post-processor cls/sep must be [token, id]");
        return cls_sep_forms(st, cls, sep, type[0] == 'R');
    }
    if (!strcmp(type, "TemplateProcessing"))
        return parse_template(c, o, st);
    return kwk_err_set(c->err, KWK_EUNSUPPORTED, "%s: post-processor %s is not supported",
                       c->label, type);
}

static int parse_step(struct jctx *c, json_t *o, struct tok_step *st, int family)
{
    memset(st, 0, sizeof *st);
    if (!o || json_is_null(o))
        return 0;
    const char *type = jstr(o, "type");
    if (!type)
        return bad(c, "a pipeline step has no type");
    switch (family) {
    case FAM_NORM: return parse_norm(c, o, type, st);
    case FAM_PRE: return parse_pre(c, o, type, st);
    case FAM_DEC: return parse_dec(c, o, type, st);
    default: return parse_post(c, o, type, st);
    }
}

/* ---- model ---------------------------------------------------------------------------- */

static int parse_merges(struct jctx *c, json_t *merges)
{
    struct kwk_tokenizer *t = c->t;
    size_t n = json_array_size(merges);
    if (tok_pairmap_init(&t->merges, n))
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a, *b;
        size_t na, nb;
        if (json_is_string(m)) {
            a = json_string_value(m);
            size_t len = json_string_length(m);
            /* Split at the first space after the first character, as HF does for "a b". */
            const char *sp = len > 1 ? memchr(a + 1, ' ', len - 1) : NULL;
            if (!sp)
                return bad(c, "a merge is not \"left right\"");
            na = (size_t)(sp - a);
            b = sp + 1;
            nb = len - na - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            na = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            nb = json_string_length(json_array_get(m, 1));
        } else {
            return bad(c, "a merge is neither a string nor a pair");
        }
        int rc = tok_add_merge(t, a, na, b, nb, (int32_t)i);
        if (rc)
            return rc;
    }
    return 0;
}

static int parse_model(struct jctx *c, json_t *model, int32_t max_added)
{
    struct kwk_tokenizer *t = c->t;
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    const char *type = jstr(model, "type");
    if (!type)
        type = merges ? "BPE" : json_is_array(vocab) ? "Unigram"
               : json_object_get(model, "max_input_chars_per_word") ? "WordPiece" : "WordLevel";
    if (!strcmp(type, "BPE"))
        t->model = TOK_MODEL_BPE;
    else if (!strcmp(type, "WordPiece"))
        t->model = TOK_MODEL_WORDPIECE;
    else if (!strcmp(type, "Unigram"))
        t->model = TOK_MODEL_UNIGRAM;
    else if (!strcmp(type, "WordLevel"))
        t->model = TOK_MODEL_WORDLEVEL;
    else
        return kwk_err_set(c->err, KWK_EUNSUPPORTED, "%s: model %s is not supported", c->label,
                           type);
    int32_t n = max_added + 1;
    if (t->model == TOK_MODEL_UNIGRAM) {
        if (!json_is_array(vocab))
            return bad(c, "Unigram vocab must be a list of [piece, score]");
        n = KWK_MAX(n, (int32_t)json_array_size(vocab));
    } else {
        const char *k;
        json_t *v;
        if (!json_is_object(vocab))
            return bad(c, "model vocab must be an object");
        json_object_foreach(vocab, k, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) >= TOK_MAX_VOCAB)
                return bad(c, "a vocab id is not an integer in range (0 to 2^24 - 1)");
            n = KWK_MAX(n, (int32_t)json_integer_value(v) + 1);
        }
    }
    int rc = tok_vocab_alloc(t, n, c->err);
    if (rc)
        return rc;
    if (t->model == TOK_MODEL_UNIGRAM) {
        t->scores = kwk_calloc((size_t)n, sizeof *t->scores);
        if (!t->scores)
            return -ENOMEM;
        t->min_score = 0;
        for (size_t i = 0; i < json_array_size(vocab); i++) {
            json_t *e = json_array_get(vocab, i), *p = json_array_get(e, 0);
            if (!json_is_string(p) || !json_is_number(json_array_get(e, 1)))
                return bad(c, "Unigram vocab entry must be [piece, score]");
            if ((rc = tok_set_piece(t, (int32_t)i, json_string_value(p), json_string_length(p))))
                return rc;
            t->scores[i] = json_number_value(json_array_get(e, 1));
            if (t->scores[i] < t->min_score)
                t->min_score = t->scores[i];
        }
        json_t *unk = json_object_get(model, "unk_id");
        t->unk_id = jid(unk);
        if (unk && !json_is_null(unk) && (t->unk_id < 0 || t->unk_id >= (int32_t)n))
            return bad(c, "Unigram unk_id is not an id of its vocabulary");
        t->byte_fallback = jbool(model, "byte_fallback", 0);
        t->fuse_unk = 1;
    } else {
        const char *k;
        json_t *v;
        json_object_foreach(vocab, k, v) {
            size_t kl = strlen(k);
            if ((rc = tok_set_piece(t, (int32_t)json_integer_value(v), k, kl)))
                return rc;
        }
        const char *unk = jstr(model, "unk_token");
        t->unk_id = unk ? tok_map_get(&t->vocab, unk, strlen(unk)) : -1;
        const char *pre = jstr(model, "continuing_subword_prefix");
        if (t->model == TOK_MODEL_WORDPIECE && !pre)
            pre = "##";
        if (pre) {
            t->cont_prefix_len = strlen(pre);
            if (!(t->cont_prefix = dup_n(pre, t->cont_prefix_len)))
                return -ENOMEM;
        }
        const char *suf = jstr(model, "end_of_word_suffix");
        if (suf && *suf) {
            t->end_suffix_len = strlen(suf);
            if (!(t->end_suffix = dup_n(suf, t->end_suffix_len)))
                return -ENOMEM;
        }
        t->max_chars_per_word = jint(model, "max_input_chars_per_word", 100);
        t->byte_fallback = jbool(model, "byte_fallback", 0);
        t->fuse_unk = jbool(model, "fuse_unk", 0);
        t->ignore_merges = jbool(model, "ignore_merges", 0);
        if (t->model == TOK_MODEL_BPE && merges) {
            if (!json_is_array(merges))
                return bad(c, "merges must be a list");
            if ((rc = parse_merges(c, merges)))
                return rc;
        }
    }
    return 0;
}

static int parse_added(struct jctx *c, json_t *added)
{
    struct kwk_tokenizer *t = c->t;
    size_t n = json_array_size(added);
    t->added = kwk_calloc(n ? n : 1, sizeof *t->added);
    if (!t->added)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(added, i), *content = json_object_get(a, "content");
        struct tok_added *d = &t->added[t->n_added];
        if (!json_is_string(content) || !json_is_integer(json_object_get(a, "id")))
            return bad(c, "an added token needs id and content");
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        if (id < 0 || id >= TOK_MAX_VOCAB) /* checked before the cast could wrap it */
            return bad(c, "an added token id is out of range (0 to 2^24 - 1)");
        d->id = (int32_t)id;
        d->len = json_string_length(content);
        if (!(d->content = dup_n(json_string_value(content), d->len)))
            return -ENOMEM;
        d->special = jbool(a, "special", 0);
        d->lstrip = jbool(a, "lstrip", 0);
        d->rstrip = jbool(a, "rstrip", 0);
        d->normalized = jbool(a, "normalized", !d->special);
        d->single_word = jbool(a, "single_word", 0);
        t->n_added++;
    }
    return 0;
}

int tok_load_json_text(struct kwk_tokenizer *t, const char *text, size_t len, const char *label,
                       struct kwk_err *err)
{
    json_error_t je;
    struct jctx c = {t, label, err};
    int rc = 0;
    json_t *root = json_loadb(text, len, JSON_ALLOW_NUL, &je);
    if (!root) {
        rc = kwk_err_set_pos(err, KWK_EFORMAT, je.position, "%s:%d:%d: %s", label, je.line,
                             je.column, je.text);
        if (err) {
            err->line = je.line;
            err->col = je.column;
        }
        return rc;
    }
    json_t *model = json_object_get(root, "model"), *added = json_object_get(root, "added_tokens");
    if (!json_is_object(model)) {
        rc = bad(&c, "no \"model\" object");
        goto out;
    }
    if (added && !json_is_array(added)) {
        rc = bad(&c, "\"added_tokens\" is not a list");
        goto out;
    }
    if ((rc = parse_added(&c, added)))
        goto out;
    int32_t max_added = -1;
    for (int i = 0; i < t->n_added; i++) {
        max_added = KWK_MAX(max_added, t->added[i].id);
    }
    if ((rc = parse_model(&c, model, max_added)))
        goto out;
    if ((rc = parse_step(&c, json_object_get(root, "normalizer"), &t->normalizer, FAM_NORM)) ||
        (rc = parse_step(&c, json_object_get(root, "pre_tokenizer"), &t->pretok, FAM_PRE)) ||
        (rc = parse_step(&c, json_object_get(root, "decoder"), &t->decoder, FAM_DEC)) ||
        (rc = parse_step(&c, json_object_get(root, "post_processor"), &t->post, FAM_POST)))
        goto out;
out:
    json_decref(root);
    if (rc == -ENOMEM)
        kwk_err_set(err, rc, "%s: out of memory", label);
    return rc;
}
