/* serve.h - `kwker serve`: the OpenAI-compatible HTTP server's internal contract. openai.c parses
 * request bodies into struct srv_req and builds response / SSE chunk JSON (no HTTP, no threads:
 * any thread, one request per call); metrics.c keeps the server's counters (any thread); http.c
 * is the libmicrohttpd glue (its event-loop thread and the engine's event thread). */
#ifndef KWK_SERVE_H
#define KWK_SERVE_H

#include <jansson.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../cli.h"
#include "kwker.h"

/* ---- options (cmd_serve.c fills them, http.c runs them) -------------------------------------- */

struct srv_opts {
    const char *model;       /* path or id; the bundled default when not given */
    const char *model_name;  /* the id /v1/models shows and requests must name */
    const char *host;        /* IPv4 or IPv6 literal, or a host name resolved once */
    int port;                /* 0: any free port (the bound port is logged) */
    const char *api_key;     /* NULL or "": no auth */
    struct kwk_engine_params engine;
    struct cli_quant quant;  /* --mix-bits, --calib, --gptq, --act-bits: into engine */
    int timeout_s;           /* idle / slow clients are closed after this many seconds */
    size_t max_body;         /* request bodies over this get 413 */
    size_t max_header;       /* per-connection memory for the request line and headers */
    int max_connections;     /* 0: as many as the file-descriptor limit allows */
    int log_requests;        /* one stderr line per request */
    int shutdown_timeout_s;  /* on a signal: seconds the requests in flight may take to finish */
    const char *chat_template_file; /* --chat-template-file, or NULL: the model's template */
    const char *chat_template_kwargs; /* --chat-template-kwargs: a JSON object of variables
                                       * every chat render gets (a request's own win), or NULL */
    int tool_format;         /* --tool-format: enum srv_tool_format, or -1: read off the template */
    int reasoning_format;    /* --reasoning-format: enum srv_reasoning_format */
    int pooling;             /* --pooling for an encoder: enum kwk_pooling, or -1: the model's */
    int normalize;           /* --normalize / --no-normalize: 1 / 0, or -1: the model's */
};

/* ---- parsed requests ------------------------------------------------------------------------- */

/* What a request body is parsed as: the two OpenAI routes, and vLLM's /tokenize and
 * /detokenize (llama.cpp's server has both as well). */
enum srv_kind { SRV_CHAT = 1, SRV_COMPLETION = 2, SRV_TOKENIZE = 3, SRV_DETOKENIZE = 4 };

#define SRV_MAX_STOP 4
#define SRV_MAX_STOP_IDS 64   /* vLLM's stop_token_ids of one request */
#define SRV_MAX_DEPTH 64      /* JSON nesting a request body may have */
#define SRV_MAX_TOP 20        /* top_logprobs (OpenAI's limit) */
#define SRV_MAX_TOOLS 128     /* functions in "tools" (OpenAI's limit) */
#define SRV_TOOL_NAME_MAX 64  /* a function name's bytes (OpenAI's limit) */
#define SRV_MAX_CHOICES 128   /* "n" (OpenAI's limit) */
#define SRV_MAX_BEST_OF 20    /* "best_of" (OpenAI's limit; at least n) */

/* How a model writes tool calls (toolcall.c): read off its chat template. */
enum srv_tool_format {
    SRV_TOOLS_GENERIC = 0, /* the template knows no tools: {"tool_calls": [...]} or
                            * {"response": "..."}, described in a system message */
    SRV_TOOLS_HERMES,      /* <tool_call>\n{"name", "arguments"}\n</tool_call> (Hermes, Qwen) */
    SRV_TOOLS_LLAMA3,      /* {"name", "parameters"} (Llama 3.1-3.3) */
    SRV_TOOLS_MISTRAL,     /* [TOOL_CALLS][{"name", "arguments", "id"}] (Mistral Nemo) */
    SRV_TOOLS_FUNCTIONARY, /* <function=NAME>{...}</function>, <|python_tag|> (Functionary
                            * v3.1 on Llama 3.1) */
    SRV_TOOLS_DEEPSEEK_R1, /* <｜tool▁calls▁begin｜> blocks after a <think> (R1 distills) */
    SRV_TOOLS_FIREFUNCTION, /* functools[{"name", "arguments"}, ...] (Firefunction v2) */
    SRV_TOOLS_COMMAND_R,   /* the generic reply, the tools also given to the template, which
                            * describes them itself (Command R+; llama.cpp: generic) */
    SRV_TOOLS_N
};
enum srv_tool_choice { SRV_TOOL_NONE = 0, SRV_TOOL_AUTO, SRV_TOOL_REQUIRED, SRV_TOOL_NAMED };

/* --reasoning-format (llama.cpp's names): auto and deepseek split a thinking template's replies
 * into reasoning_content and content; none leaves the think block in content. */
enum srv_reasoning_format { SRV_REASONING_AUTO = 0, SRV_REASONING_DEEPSEEK, SRV_REASONING_NONE };
/* llama.cpp's names (its deepseek-legacy, reasoning kept in content too, is not offered); -1
 * when unknown. Thread-safe. */
int srv_reasoning_format_parse(const char *name);

/* How a chat reply's think block is read (srv_req.think, set per request from its prompt). */
enum srv_think_mode {
    SRV_THINK_OFF = 0, /* not split: all of it is content */
    SRV_THINK_ON,      /* a block the reply opens with <think> is reasoning */
    SRV_THINK_OPEN     /* the prompt opened the block: the reply starts inside it */
};

/* What the parser checks against. */
struct srv_limits {
    int n_vocab;        /* token ids (prompt ids, logit_bias keys) must be below */
    int max_cache_len;  /* max_tokens must be at most */
    int tool_format;    /* enum srv_tool_format of the model's template */
};

/* An OpenAI error: HTTP status, then the fields of {"error": {...}}. type/param/code are static
 * strings (param and code may be NULL: JSON null). */
struct srv_err {
    int http;
    const char *type;
    const char *param;
    const char *code;
    char msg[320];
};

/* One /v1/chat/completions or /v1/completions body. Owned strings and arrays; srv_req_free. */
struct srv_req {
    int kind;                   /* enum srv_kind */
    char *model;
    json_t *messages;           /* chat: [{role, content: string}] ready for the template */
    char *prompt;               /* completions: text (NUL-terminated, prompt_len bytes) */
    size_t prompt_len;
    int32_t *prompt_ids;        /* completions: token ids instead of text */
    int n_prompt_ids;
    int max_tokens;             /* -1: until eos or the context is full */
    int n;                      /* choices in the reply, 1..SRV_MAX_CHOICES */
    int echo;                   /* completions: the prompt leads each choice's text (and its
                                 * tokens' logprobs, with logprobs); max_tokens may be 0 */
    int best_of;                /* choices generated (completions' best_of; else n), >= n */
    int sample;                 /* 0: greedy (temperature 0) */
    double temperature, top_p, min_p;
    int top_k;                  /* 0 off */
    double presence_penalty, frequency_penalty;
    double repetition_penalty;  /* vLLM's (transformers'): prompt and reply tokens; 1 off */
    int seed_given;
    uint64_t seed;
    char *stop[SRV_MAX_STOP];
    int n_stop;
    int32_t stop_ids[SRV_MAX_STOP_IDS]; /* vLLM's stop_token_ids: end the reply as eos does */
    int n_stop_ids;
    int min_tokens;             /* vLLM's: eos and stop_token_ids held back until this many */
    int ignore_eos;             /* vLLM's: the model's eos ids do not end the reply */
    int32_t *bias_ids;          /* [n_bias] */
    float *bias;
    int n_bias;
    int logprobs;               /* 1: per-token logprobs in the reply */
    int top_logprobs;           /* alternatives per token, 0..SRV_MAX_TOP */
    int stream;
    int include_usage;
    kwk_grammar *grammar;       /* response_format / json_schema / grammar / tools, or NULL */
    const char *grammar_trigger; /* static: the grammar is lazy (tool_choice "auto"), or NULL */
    int grammar_gbnf;           /* the grammar is the request's own GBNF ("grammar") */
    json_t *tools;              /* the functions the model is told of (for the template), or
                                 * NULL (none given, or tool_choice "none") */
    int tool_choice;            /* enum srv_tool_choice (with tools) */
    char *tool_name;            /* SRV_TOOL_NAMED: the function */
    int parallel_tools;         /* parallel_tool_calls (default 1) */
    int tool_format;            /* enum srv_tool_format the reply is read in (with tools) */
    int think;                  /* enum srv_think_mode: chat on a thinking template (http.c
                                 * sets it from the rendered prompt; the parser leaves 0) */
    int reasoning_format;       /* chat: enum srv_reasoning_format (llama.cpp's request field),
                                 * or -1: the server's --reasoning-format */
    int include_reasoning;      /* chat: vLLM's; 0 drops reasoning_content (default 1) */
    /* tokenize: messages (chat) or prompt (text); detokenize: prompt_ids */
    int add_special_tokens;     /* the tokenizer's own BOS etc. (default: text 1, messages 0) */
    int add_generation_prompt;  /* messages: the template's assistant header (default 1) */
    int continue_final;         /* messages: continue_final_message (transformers', vLLM's):
                                 * the prompt ends inside the final message, which the reply
                                 * continues (an assistant's prefill) */
    json_t *template_kwargs;    /* messages: chat_template_kwargs (an object), or NULL */
    int return_token_strs;      /* tokenize: each id's vocabulary string too */
};

/* Nesting depth of a JSON text (brackets outside strings); a cheap pass run before jansson, whose
 * parser recurses. Returns 1 when depth <= max_depth. Thread-safe. */
int srv_json_depth_ok(const char *s, size_t len, int max_depth);

/* Parse body[len] of kind into r (zeroed first). Returns 0, or -1 with e filled (400 and the
 * parameter at fault) and r freed. Does not render templates or tokenize. Thread-safe. */
int srv_req_parse(struct srv_req *r, int kind, const char *body, size_t len,
                  const struct srv_limits *lim, struct srv_err *e);
void srv_req_free(struct srv_req *r);

/* A compiled r->grammar whose start the matcher cannot hold (more alternatives at once than its
 * limit) would fail the request at submit: 0 when it can, else -1 with e (the client's 400 on
 * param, or out of memory) and the grammar freed. */
int srv_grammar_check_start(struct srv_req *r, const char *param, struct srv_err *e);

/* Whether kw may be a chat template's extra variables (param names it in e): an object that
 * sets none of the variables a request's own fields set (messages, tools, documents,
 * add_generation_prompt). 0, or -1 with e filled (400). Thread-safe. */
int srv_template_kwargs_check(const json_t *kw, const char *param, struct srv_err *e);

/* continue_final_message as transformers' apply_chat_template does it: the final message is
 * rendered with SRV_CONTINUE_TAG appended to its content, then srv_continue_cut gives where the
 * prompt ends: at the tag, or before the whitespace ahead of it when the template trimmed the
 * message (Python's str.isspace). -1 when the template dropped the message (its stripped
 * content final[final_len], or the tag, is not in text): a 400. Thread-safe. */
#define SRV_CONTINUE_TAG "CONTINUE_FINAL_MESSAGE_TAG "
long srv_continue_cut(const char *text, size_t len, const char *final, size_t final_len);

/* Fill e; msg is printf-formatted. */
void srv_err_set(struct srv_err *e, int http, const char *type, const char *param,
                 const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* -1 with e a 400 invalid_type: "'key' must be want". */
int srv_err_type(struct srv_err *e, const char *key, const char *want);
/* -1 with e a 500: out of memory. */
int srv_err_oom(struct srv_err *e);
/* A NUL-terminated malloc'd copy of s[n], or NULL. */
char *srv_dup_n(const char *s, size_t n);

/* ---- tool calls (toolcall.c) ---------------------------------------------------------------- */

int srv_tool_format_detect(const char *template_src);
int srv_tool_format_parse(const char *name); /* -1 when unknown */
const char *srv_tool_format_name(int format);
/* The format's markers that are special tokens of tok (one token each), whose text a reply
 * with tools must keep (kwk_gen_params.preserved_ids): up to cap ids into ids, their count
 * returned (0 when none is special). Thread-safe. */
#define SRV_MAX_PRESERVED 8
int srv_tool_preserved(int format, const kwk_tokenizer *tok, int32_t *ids, int cap);
/* ids[n] (a server's preserved list) as request q's reply keeps them, into out (n entries at
 * most): Functionary's <|python_tag|> only when q offers a "python" or "ipython" tool (its
 * code is a call of that tool alone; llama.cpp's rule). Returns the count. Thread-safe. */
int srv_tool_preserved_req(const struct srv_req *q, const kwk_tokenizer *tok, const int32_t *ids,
                           int n, int32_t *out);
/* The same for the NULL-terminated texts: those tok reads as one special token each. */
int srv_special_tokens(const kwk_tokenizer *tok, const char *const *texts, int32_t *ids, int cap);

/* "tools", "tool_choice" and "parallel_tool_calls" of root into r, after the messages: the
 * calls' grammar compiled (lazy under "auto"), and for the generic format the system message
 * that describes the tools and earlier calls written as its JSON. Returns 0 or -1 with e. */
int srv_tools_parse(struct srv_req *r, json_t *root, int format, struct srv_err *e);

/* A reply's text read in q's tool_format: content (text's prefix, or the generic format's
 * "response") and OpenAI's tool_calls, or calls NULL when the text is not a whole call reply or
 * calls a function not in q's tools (NULL: any name) (then all of it is content). */
struct srv_tool_reply {
    const char *content;        /* into the text, or own */
    size_t content_len;
    int null_content;           /* calls with only whitespace before them: content is null */
    json_t *calls;              /* [{"id", "type": "function", "function": {"name",
                                 * "arguments": JSON text}}], or NULL */
    char *own;
    int named;                  /* q's tool_choice named the function: finish_reason "stop",
                                 * as OpenAI answers a forced call */
    const char *reasoning;      /* into the text: the think block's inside (q->think), as
                                 * "reasoning_content", or NULL (none, or only whitespace) */
    size_t reasoning_len;
};
/* The think block split off first (srv_think_reply), then the calls read from the rest. */
int srv_tools_extract(const struct srv_req *q, const char *text, size_t len, uint64_t seed,
                      struct srv_tool_reply *out);
void srv_tool_reply_free(struct srv_tool_reply *r);
/* While streaming: how many bytes of text are surely content (before the format's trigger,
 * or a tail that could begin it). */
size_t srv_tools_sendable(int format, const char *text, size_t len);
/* The template's context (messages, tools, ...) as q's format wants it: the generic format's
 * tools are described by its system message, not the template; Firefunction v2's template
 * reads "functions" (the tools as indented JSON, "" without) and "datetime" instead of
 * "tools", as llama.cpp's server gives them, with tools or not (server_format: the format of
 * the server's template). Returns 0, or -ENOMEM. */
int srv_tools_context(const struct srv_req *q, int server_format, json_t *ctx);

/* ---- thinking models' replies (think.c) ------------------------------------------------------ */

/* Whether a chat template thinks: it names <think> or </think>. Thread-safe. */
int srv_think_template(const char *template_src);
/* Whether a rendered prompt leaves the reply inside a think block: it ends with "<think>" and
 * whitespace (R1's and QwQ's generation prompts). */
int srv_think_prompt_open(const char *prompt, size_t len);

/* A reply's text split as llama.cpp's --reasoning-format deepseek reads it: when it opens with
 * <think> (after whitespace) or the prompt opened the block (open), reasoning runs to the first
 * </think> (or to the end: cut by max_tokens) and is stripped of whitespace on both sides;
 * content starts after </think> and the whitespace that follows. A reply that opens no block is
 * all content, as it came. Offsets into the text. */
struct srv_think {
    size_t reasoning, reasoning_len; /* settled reasoning (may be empty) */
    size_t content;                  /* where content starts; the text's length: none settled */
    int opened, closed;              /* the block opened (reply or prompt); </think> came */
};
/* final 0: the text is still arriving, and what a later byte could change (a "<think>" or
 * "</think>" begun at the end, trailing whitespace of the reasoning, whether a block opens at
 * all) is not settled; what is settled is a prefix of the final split's fields. */
void srv_think_split(const char *text, size_t len, int open, int final, struct srv_think *out);
/* The whole reply into out's content and reasoning (reasoning NULL when empty) per q->think;
 * calls untouched. */
void srv_think_reply(const struct srv_req *q, const char *text, size_t len,
                     struct srv_tool_reply *out);

/* A streaming chat reply's progress: offsets of the text up to which each field was sent. */
struct srv_reply_stream {
    size_t reasoning_sent, content_sent;
};
/* What to send now of each field (pointers into text, or done's own content). */
struct srv_delta {
    const char *reasoning, *content;
    size_t reasoning_len, content_len;
};
/* The deltas of the whole text so far (len bytes) past st, st moved: while the reply runs
 * (done NULL) what is settled (srv_think_split, and with tools srv_tools_sendable of the
 * content), at its end the rest of done's fields (the reply read whole by srv_tools_extract or
 * srv_think_reply). The deltas add up to done's fields. */
void srv_reply_stream_next(struct srv_reply_stream *st, const struct srv_req *q,
                           const char *text, size_t len, const struct srv_tool_reply *done,
                           struct srv_delta *d);
/* <think> and </think> where tok holds them as special tokens (a reasoning-split reply keeps
 * their text: kwk_gen_params.preserved_ids); their count, at most cap. */
int srv_think_preserved(const kwk_tokenizer *tok, int32_t *ids, int cap);

/* ---- a growable byte buffer with a sticky error ---------------------------------------------- */

struct srv_buf {
    char *p;
    size_t len, cap;
    int err;                    /* set once an append failed; later appends do nothing */
};

void srv_buf_add(struct srv_buf *b, const void *data, size_t n);
void srv_buf_str(struct srv_buf *b, const char *s);
void srv_buf_free(struct srv_buf *b);

/* ---- responses ------------------------------------------------------------------------------- */

/* One generated token's logprobs as the engine reported it. */
struct srv_lp {
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_ids[SRV_MAX_TOP];
    float top_lps[SRV_MAX_TOP];
};

/* What the response builders need to know about a request besides its output. */
struct srv_ctx {
    int kind;
    const char *id;             /* "chatcmpl-..." / "cmpl-..." */
    int64_t created;
    const char *model;
    const kwk_tokenizer *tok;   /* for logprob token strings; may be NULL */
    int logprobs, top_logprobs;
    int include_usage;
    size_t text_offset;         /* completions logprobs: bytes of text before the next token */
    const struct srv_tool_reply *tools; /* a streamed chat reply read for tool calls, or NULL */
    int index;                  /* the choice a streamed chunk belongs to */
};

/* One choice of a whole (non-streaming) response. */
struct srv_choice {
    const char *text;
    size_t len;
    const struct srv_lp *lps;
    int n_lps;
    int finish;                 /* enum kwk_finish */
    const struct srv_tool_reply *tools; /* chat: the reply read for tool calls or its think
                                         * block, or NULL */
};

/* {"error": {...}} as a malloc'd NUL-terminated string, NULL when out of memory. */
char *srv_json_error(const struct srv_err *e);

/* The whole non-streaming response (chat.completion / text_completion) with choices ch[n],
 * indexed in that order; n_completion counts every generated token (best_of's candidates too).
 * Appends to out. */
void srv_json_response(struct srv_buf *out, struct srv_ctx *c, const struct srv_choice *ch,
                       int n, int n_prompt, int n_completion);

/* SSE events appended to out: the chat role chunk; a content chunk (text and logprobs since the
 * last one); the chunk with finish_reason; the usage chunk; "data: [DONE]". Chunks carry
 * c->index, the choice they belong to. */
void srv_sse_role(struct srv_buf *out, const struct srv_ctx *c);
void srv_sse_content(struct srv_buf *out, struct srv_ctx *c, const char *text, size_t len,
                     const struct srv_lp *lps, int n_lps);
/* A chat chunk whose delta is {"reasoning_content": text} (and logprobs, when not NULL). */
void srv_sse_reasoning(struct srv_buf *out, struct srv_ctx *c, const char *text, size_t len,
                       const struct srv_lp *lps, int n_lps);
void srv_sse_finish(struct srv_buf *out, const struct srv_ctx *c, int finish);
void srv_sse_usage(struct srv_buf *out, const struct srv_ctx *c, int n_prompt,
                   int n_completion);
void srv_sse_error(struct srv_buf *out, const struct srv_err *e);
void srv_sse_done(struct srv_buf *out);

/* The tool calls of a streamed reply: one chunk per call (id, name and all its arguments). */
void srv_sse_tool_calls(struct srv_buf *out, const struct srv_ctx *c, const json_t *calls);

/* "stop" / "length" for a kwk_finish (a cancelled request reads "stop"). */
const char *srv_finish_name(int finish);

/* vLLM's /tokenize answer {"count", "max_model_len", "tokens"}, with "token_strs" (each id's
 * vocabulary string, e.g. "ĠParis") when tok is given, and /detokenize answer {"prompt"}
 * (bytes that are not UTF-8 become U+FFFD), appended to out. */
void srv_tokens_response(struct srv_buf *out, const int32_t *ids, size_t n, int max_model_len,
                         const kwk_tokenizer *tok);
void srv_text_response(struct srv_buf *out, const char *text, size_t len);

/* Compare a presented Authorization header value with "Bearer <key>" in time that depends only
 * on the key's length. Returns 1 on a match. Thread-safe. */
int srv_auth_ok(const char *header, const char *key);

/* ---- embeddings (embed.c: /v1/embeddings bodies and replies; no HTTP, no threads) ---------- */

#define SRV_EMBED_MAX_INPUTS 2048   /* inputs of one request (OpenAI's limit) */
#define SRV_EMBED_BATCH_TOKENS 2048 /* tokens of the requests the encoder runs together */

/* What an embeddings body is checked against. */
struct srv_embed_limits {
    int n_vocab;      /* token ids must be below */
    int dim;          /* the embedding size: the only 'dimensions' accepted */
    int max_tokens;   /* tokens of one input, special tokens included */
};

/* One input as the body gave it: text, or token ids taken as given. */
struct srv_embed_input {
    char *text;       /* NUL-terminated, text_len bytes; NULL for ids */
    size_t text_len;
    int32_t *ids;     /* [n_ids] when text is NULL */
    int n_ids;
};

/* One /v1/embeddings body. Owned; srv_embed_req_free. After srv_embed_pack, ids / offs hold
 * every input's tokens in kwk_encoder_embed's layout. */
struct srv_embed_req {
    char *model;
    struct srv_embed_input *in;  /* [n_in] */
    int n_in;
    int base64;                  /* encoding_format "base64": little-endian float32, base64 */
    int32_t *ids;                /* [offs[n_in]] after srv_embed_pack */
    int32_t *offs;               /* [n_in + 1] */
    int failed;                  /* after srv_embed_pack failed: the input at fault, or -1 */
};

/* A request body's JSON: an object, or NULL with e (400 invalid_json: not JSON, nested deeper
 * than SRV_MAX_DEPTH, a key twice, not an object). Thread-safe. */
json_t *srv_json_body(const char *body, size_t len, struct srv_err *e);

/* root's "input" into r->in / n_in (the embeddings body's forms; /classify's too). 0 or -1 with
 * e. */
int srv_embed_input_parse(struct srv_embed_req *r, json_t *root,
                          const struct srv_embed_limits *lim, struct srv_err *e);

/* Parse body[len] into r (zeroed first): input, model, encoding_format, dimensions, user.
 * Returns 0, or -1 with e (a 400 naming the field and the input's index) and r freed. Does not
 * tokenize. Thread-safe. */
int srv_embed_parse(struct srv_embed_req *r, const char *body, size_t len,
                    const struct srv_embed_limits *lim, struct srv_err *e);

/* Tokenizes text the way kwk_tokenizer_encode does with add_special = 1 (a parameter so that
 * tests and the fuzz target run without a model): up to cap ids, the full count in *n, 0 or
 * KWK_ELIMIT when cap < *n, another negative code on failure. */
typedef int (*srv_encode_fn)(void *user, const char *text, size_t len, int32_t *ids, size_t cap,
                             size_t *n);

/* Every input's tokens into r->ids / r->offs: texts through encode, ids as given. A 400
 * context_length_exceeded (naming the input) when one holds more than lim->max_tokens. Returns
 * 0 or -1 with e. */
int srv_embed_pack(struct srv_embed_req *r, srv_encode_fn encode, void *user,
                   const struct srv_embed_limits *lim, struct srv_err *e);
void srv_embed_req_free(struct srv_embed_req *r);

/* OpenAI's reply {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
 * "model", "usage"} for vec[n][dim], each embedding a list of numbers that read back as the
 * same float32 (null for a non-finite one) or, with base64, its little-endian bytes in base64.
 * Appended to out. */
void srv_embed_response(struct srv_buf *out, const char *model, const float *vec, int n,
                        int dim, int base64, int n_tokens);

/* ---- rerank (rerank.c: /v1/rerank bodies and replies; no HTTP, no threads) ----------------- */

#define SRV_RERANK_MAX_DOCS 1000  /* documents of one request (Cohere's and Voyage's bound) */
/* Bytes the tokenizer reads for one request: each pair's query and document, so the query is
 * counted once per document (a long query is tokenized with every document). */
#define SRV_RERANK_MAX_TEXT ((size_t)8 << 20)

/* One document: a string of the body, or the string "text" of an object (Jina's, Cohere's). */
struct srv_rerank_doc {
    char *text;                  /* NUL-terminated, len bytes (may be empty) */
    size_t len;
};

/* One /v1/rerank body. Owned; srv_rerank_req_free. After srv_rerank_pack, ids / types / offs
 * hold every (query, document) pair in kwk_encoder_classify's layout. */
struct srv_rerank_req {
    char *model;                 /* NULL when the body names none (optional, as vLLM's) */
    char *query;                 /* NUL-terminated, query_len bytes (may be empty) */
    size_t query_len;
    struct srv_rerank_doc *docs; /* [n_docs] */
    int n_docs;
    int top_n;                   /* results kept, 1..n_docs (absent, null or 0: all) */
    int return_documents;        /* each result carries {"text"} (default 1) */
    int32_t *ids, *types;        /* [offs[n_docs]] after srv_rerank_pack */
    int32_t *offs;               /* [n_docs + 1] */
};

/* Parse body[len] into r (zeroed first): query, documents, top_n, return_documents, model.
 * Returns 0, or -1 with e (a 400 naming the field, and the document's index) and r freed. Does
 * not tokenize. Thread-safe. */
int srv_rerank_parse(struct srv_rerank_req *r, const char *body, size_t len, struct srv_err *e);

/* Tokenizes a pair as kwk_tokenizer_encode_pair does with max_tokens = cap (a parameter so that
 * tests and the fuzz target run without a model): the pair truncated to at most cap ids, its
 * ids and type ids written to ids[cap] / types[cap], the count to *n. 0, or a negative code. */
typedef int (*srv_pair_fn)(void *user, const char *a, size_t na, const char *b, size_t nb,
                           int32_t *ids, int32_t *types, size_t cap, size_t *n);

/* Sequences in kwk_encoder_classify's layout: sequence i is ids[offs[i] .. offs[i + 1]), its
 * type ids in types. Owned by whoever filled them. */
struct srv_packed {
    int32_t *ids, *types;
    int32_t *offs;
};

/* Pairs to tokenize: pair i is (a[i * a_step], b[i]), i < n (a_step 0: one first text paired
 * with every b, a reranker's query). */
struct srv_pairs {
    const struct srv_rerank_doc *a, *b;
    int a_step, n;
    int limit;               /* tokens a pair may hold, special tokens included */
    int strict;              /* 1: a longer pair is a 400 context_length_exceeded (vLLM's /score
                              * without truncate_prompt_tokens); 0: truncated longest_first */
    const char *param;       /* the body's field of the pairs, for errors */
    const char *what;        /* what pair i is called in messages: "document", "pair" */
    const char *limit_param; /* the body's field that set limit (a limit too small for the
                              * pair form is then a 400 on it), or NULL: the model's own */
};

/* Every pair of pl through encode into p (zeroed by the caller; freed by it, also on failure).
 * Returns 0, or -1 with e: 400 for a pair of no tokens at all, one over a strict limit or a
 * limit the request set too small for the special tokens; 500 when out of memory or the
 * tokenizer failed. */
int srv_pairs_pack(struct srv_packed *p, const struct srv_pairs *pl, srv_pair_fn encode,
                   void *user, struct srv_err *e);

/* Every (query, document i) pair through encode into r->ids / types / offs, each truncated to
 * max_tokens as Hugging Face's CrossEncoder does (never an error). Returns 0, or -1 with e (400:
 * a pair of no tokens at all; 500: out of memory or the tokenizer failed). */
int srv_rerank_pack(struct srv_rerank_req *r, srv_pair_fn encode, void *user, int max_tokens,
                    struct srv_err *e);
/* r itself from the CLI: query and documents copied; top_n 0 for all. 0, or -1 when out of
 * memory (r freed). */
int srv_rerank_init(struct srv_rerank_req *r, const char *query, size_t query_len,
                    const char *const *docs, const size_t *doc_lens, int n_docs, int top_n);
void srv_rerank_req_free(struct srv_rerank_req *r);

/* Scores of the head's logits[n][1] by act (enum kwk_score_act), in place. */
void srv_rerank_scores(float *logits, int n, int act);

/* The reply {"id", "object": "list", "model", "results": [{"index", "relevance_score",
 * "document": {"text"}}], "usage": {"prompt_tokens", "total_tokens"}}: results by score, the
 * highest first (equal scores by index; a NaN last, written null), cut to r->top_n. id NULL:
 * no "id" (the CLI). Appended to out. */
void srv_rerank_response(struct srv_buf *out, const char *id, const char *model,
                         const struct srv_rerank_req *r, const float *scores);

/* A JSON string of bytes that may not be valid UTF-8 (invalid sequences become U+FFFD), or
 * NULL when out of memory. */
json_t *srv_json_text(const char *s, size_t n);
/* The same appended to out as JSON text (out->err when out of memory). */
void srv_buf_json_text(struct srv_buf *out, const char *s, size_t n);

/* ---- score and classify (score.c: vLLM's /score and /classify bodies and replies) ---------- */

#define SRV_SCORE_MAX_TEXTS 1000 /* texts on each side of a /score body (as rerank's documents) */

/* truncate_prompt_tokens as vLLM reads it: absent or null, none (a longer input is a 400);
 * -1, the model's limit; k > 0, at most k tokens (Hugging Face's truncation: a text loses its
 * end, the special tokens stay; a pair's longer text first). 0 and below -1 are 400s. */
#define SRV_TRUNC_NONE 0

/* What truncate_prompt_tokens means for a model of max_tokens. */
struct srv_trunc {
    int limit;  /* tokens a sequence may hold */
    int strict; /* 1: a longer one is a 400; 0: truncated to limit */
};
/* 0, or -1 with e (400: k above max_tokens, as vLLM refuses it). */
int srv_trunc_resolve(int truncate, int max_tokens, struct srv_trunc *t, struct srv_err *e);

/* One /score body. Owned; srv_score_req_free. */
struct srv_score_req {
    char *model;                 /* NULL when the body names none */
    struct srv_rerank_doc *a, *b; /* the first texts [n_a] and the second [n_b] */
    int n_a, n_b;                /* n_a is 1 (paired with every b: 1:N) or n_b (pairwise) */
    const char *name_a, *name_b; /* the body's names of the two sides: text_1 / text_2,
                                  * queries / documents, queries / items or data_1 / data_2 */
    int truncate;                /* SRV_TRUNC_NONE, -1 or k > 0 */
    int use_activation;          /* 0: a cross-encoder's raw logits (default 1) */
    struct srv_packed pairs;     /* cross-encoder: the n_b pairs, after srv_score_pack_pairs */
    struct srv_embed_req uniq;   /* embedding model: the distinct texts, each once, after
                                  * srv_score_pack_texts */
    int *a_of, *b_of;            /* [n_a] / [n_b]: each text's index in uniq */
};

/* Parse body[len] into r (zeroed first): the two sides under any of vLLM's names, model,
 * truncate_prompt_tokens, use_activation, encoding_format ("float"), user. Returns 0, or -1
 * with e (a 400 naming the field and the text's index: a missing side, an empty list, lengths
 * neither 1:N nor N:N, more than SRV_SCORE_MAX_TEXTS a side or SRV_RERANK_MAX_TEXT bytes of
 * pairs) and r freed. Does not tokenize. Thread-safe. */
int srv_score_parse(struct srv_score_req *r, const char *body, size_t len, struct srv_err *e);
/* A cross-encoder's pairs through encode into r->pairs, per t. 0 or -1 with e. */
int srv_score_pack_pairs(struct srv_score_req *r, srv_pair_fn encode, void *user,
                         const struct srv_trunc *t, struct srv_err *e);
/* An embedding model's texts, each distinct one once, through encode (which truncates to cap
 * when t is not strict) into r->uniq. 0 or -1 with e. */
int srv_score_pack_texts(struct srv_score_req *r, srv_encode_fn encode, void *user,
                         const struct srv_trunc *t, struct srv_err *e);
void srv_score_req_free(struct srv_score_req *r);

/* scores[n_b]: the cosine similarity of each pair's embeddings, vec[r->uniq.n_in][dim] (0 for
 * a zero vector, as torch's cosine_similarity). */
void srv_score_cosines(const struct srv_score_req *r, const float *vec, int dim, float *scores);

/* vLLM's reply {"id", "object": "list", "created", "model", "data": [{"index", "object":
 * "score", "score"}], "usage"} for scores[n] (a non-finite one null). Appended to out. */
void srv_score_response(struct srv_buf *out, const char *id, int64_t created, const char *model,
                        const float *scores, int n, int n_tokens);

/* One /classify body. Owned; srv_classify_req_free. */
struct srv_classify_req {
    struct srv_embed_req in; /* model and input as the embeddings body has them; after
                              * srv_classify_pack its ids / offs */
    int truncate;            /* SRV_TRUNC_NONE, -1 or k > 0 */
    int use_activation;      /* 0: the raw logits as probs (default 1) */
};

/* Parse body[len] into r (zeroed first): input (strings or token ids, as /v1/embeddings'),
 * model, truncate_prompt_tokens, use_activation, user. 0, or -1 with e and r freed. */
int srv_classify_parse(struct srv_classify_req *r, const char *body, size_t len,
                       const struct srv_embed_limits *lim, struct srv_err *e);
/* The inputs through encode (truncating to cap when t is not strict; token ids keep their
 * first t->limit) into r->in.ids / offs. 0 or -1 with e. */
int srv_classify_pack(struct srv_classify_req *r, srv_encode_fn encode, void *user,
                      const struct srv_trunc *t, struct srv_err *e);
void srv_classify_req_free(struct srv_classify_req *r);

/* How /classify turns logits into probs (vLLM's, after transformers' problem_type). */
enum srv_cls_act {
    SRV_CLS_AUTO = 0,     /* sigmoid for one label, else softmax (vLLM's PoolerClassify) */
    SRV_CLS_SIGMOID = 1,  /* multi_label_classification: each label alone */
    SRV_CLS_IDENTITY = 2, /* regression: the logits */
};

/* A classifier's labels: config.json's id2label (when it names exactly the head's n labels)
 * and problem_type. */
struct srv_labels {
    char **names; /* [n], or NULL: transformers' defaults LABEL_0 ... */
    int n;
    int act;      /* enum srv_cls_act */
};
/* From config.json's text json[len] (untrusted: anything unexpected leaves the defaults).
 * Returns 0, or -1 when out of memory (l then holds the defaults). */
int srv_labels_parse(struct srv_labels *l, const char *json, size_t len, int n_labels);
void srv_labels_free(struct srv_labels *l);

/* vLLM's reply {"id", "object": "list", "created", "model", "data": [{"index", "label",
 * "probs", "num_classes"}], "usage"} for logits[n][n_labels], turned into probs in place by
 * l->act (not when use_activation is 0); each label the most probable's. Appended to out. */
void srv_classify_response(struct srv_buf *out, const char *id, int64_t created,
                           const char *model, const struct srv_labels *l, float *logits, int n,
                           int use_activation, int n_tokens);

/* srv_encode_fn over a kwk_tokenizer (user) that truncates as Hugging Face's tokenizer(text,
 * truncation=True, max_length=cap) does: the text's tokens cut to leave room for the special
 * tokens, which stay. KWK_ELIMIT when cap is below the special tokens. Thread-safe. */
int srv_encode_truncated(void *tok, const char *text, size_t len, int32_t *ids, size_t cap,
                         size_t *n);

/* ---- the encoder worker (embedq.c) ----------------------------------------------------------- */

/* One request's sequences handed to the encoder worker: embedded, or through the model's
 * classification head. The submitter fills the first block (or leaves ids .. out to prepare)
 * and keeps the job (and what it points to) valid until done is called, which the worker does
 * once per job, from its thread, on success, failure or cancellation. */
struct srv_embed_job {
    const int32_t *ids, *offs;   /* kwk_encoder_embed's layout */
    const int32_t *types;        /* classify: each token's type id, or NULL for all 0 */
    int classify;                /* 1: kwk_encoder_classify; 0: kwk_encoder_embed */
    int n_seqs;
    float *out;                  /* [n_seqs][dim], classify: [n_seqs][n_labels] */
    /* NULL, or run once on the worker's thread before the job is batched (then cleared): fills
     * ids .. out, so that a request's texts are tokenized there, not on the submitter's event
     * loop. 0, or -1 with err filled (the client's answer: a 400 for a text the tokenizer or
     * a limit refuses); done then gets KWK_EARG and err.msg. */
    int (*prepare)(struct srv_embed_job *j);
    struct srv_err err;          /* zeroed by the submitter; prepare's failure */
    void (*done)(struct srv_embed_job *j, int status, const char *msg);
    void *user;
    _Atomic int canceled;        /* set by anyone: the job is skipped if not yet running */
    struct srv_embed_job *next;  /* the queue's */
};

struct srv_embedq;

/* Start the worker thread over encoder enc (which it alone uses from now on). batch_tokens:
 * queued jobs of one kind (embed or classify) are taken (and prepared) one by one, together
 * while their tokens fit (one job at least; the first that does not fit starts the next
 * batch); max_queue: jobs that may wait, not yet taken (0: 4096, as the engine's). NULL on
 * failure. */
struct srv_embedq *srv_embedq_new(kwk_encoder *enc, int batch_tokens, int max_queue);
/* Queue j; 0, KWK_ELIMIT when max_queue jobs wait, or KWK_ECANCELED when the worker is
 * stopping (done is not called then). */
int srv_embedq_submit(struct srv_embedq *q, struct srv_embed_job *j);
/* Stop: the batch running finishes, jobs still queued end with KWK_ECANCELED; joins the
 * thread. NULL is fine. */
void srv_embedq_free(struct srv_embedq *q);
/* Batches run and sequences embedded or classified so far (any thread). */
void srv_embedq_stats(struct srv_embedq *q, uint64_t *batches, uint64_t *seqs);

/* ---- metrics --------------------------------------------------------------------------------- */

#define SRV_N_STATUS 600

struct srv_metrics {
    _Atomic uint64_t by_status[SRV_N_STATUS]; /* finished requests by HTTP status */
    _Atomic uint64_t prompt_tokens, completion_tokens;
    _Atomic uint64_t streams;                 /* streaming requests started */
    _Atomic uint64_t embed_requests;          /* /v1/embeddings requests answered 200 */
    _Atomic uint64_t embed_inputs;            /* inputs embedded for them */
    _Atomic uint64_t rerank_requests;         /* /v1/rerank requests answered 200 */
    _Atomic uint64_t rerank_documents;        /* documents scored for them */
    _Atomic uint64_t score_requests;          /* /score requests answered 200 */
    _Atomic uint64_t score_pairs;             /* pairs scored for them */
    _Atomic uint64_t classify_requests;       /* /classify requests answered 200 */
    _Atomic uint64_t classify_inputs;         /* inputs classified for them */
    _Atomic uint64_t client_aborts;           /* requests ended by a client going away */
    _Atomic uint64_t ttft_us_sum, ttft_count; /* submit to first token, as the server saw it */
    _Atomic int in_flight;  /* requests submitted whose connection MHD has not completed */
    _Atomic int draining;   /* a signal came: no new requests, the ones in flight finish */
};

void srv_metrics_status(struct srv_metrics *m, int http);
/* Prometheus text exposition of m and the engine's snapshot st (NULL: an encoder is served, no
 * engine), appended to out. */
void srv_metrics_render(struct srv_buf *out, const struct srv_metrics *m,
                        const struct kwk_engine_stats *st, unsigned connections);
/* The encoder worker's counters (an encoder is served), appended to out. */
void srv_metrics_render_embed(struct srv_buf *out, uint64_t batches, uint64_t seqs);

/* ---- the server ------------------------------------------------------------------------------ */

/* The model id a server shows for a model path (its last component, ".gguf" dropped), into
 * buf[cap]. Thread-safe. */
void srv_model_id(char *buf, size_t cap, const char *path);

/* srv_pair_fn's user over a kwk_tokenizer: the pair as kwk_tokenizer_encode_pair gives it
 * with max_tokens = cap, the first text's ids kept from the call before when it is the same
 * text (a request's query, encoded once for all its documents, not once a document). One
 * srv_rerank_pack at a time; zero-initialized with tok set, then srv_pair_enc_free. */
struct srv_pair_enc {
    const kwk_tokenizer *tok;
    const char *a; /* the text ia was encoded from (its pointer and length: the caller's) */
    size_t na;
    int32_t *ia;
    size_t la;
};
int srv_encode_pair(void *pair_enc, const char *a, size_t na, const char *b, size_t nb,
                    int32_t *ids, int32_t *types, size_t cap, size_t *n);
void srv_pair_enc_free(struct srv_pair_enc *pe);

/* Load the model, start the engine and the HTTP daemon, serve until SIGINT / SIGTERM, then drain
 * (stop listening, finish the requests in flight within shutdown_timeout_s). Returns the process
 * exit code. Main thread. */
int srv_run(const struct srv_opts *o);

#endif
