"""Constrained decoding end to end, on the real SmolLM2-135M-Instruct (the bundled GGUF).

The grammar engine and the JSON Schema converter have their own C tests (tests/c/test_grammar.c,
test_schema.c, test_schema_suite.c). Here:
- kwk_tokenizer_token_bytes: a text's tokens spell its bytes again (the bytes grammars see);
- a mask over the 49152-token vocabulary equals the brute-force answer (each token's bytes
  matched as a prefix of the grammar), at several states of a JSON schema's grammar;
- generation under a grammar is the model's own choice among the allowed tokens: greedy tokens
  equal a reference loop (the decoder's logits, the matcher's mask, argmax), sampled tokens equal
  the sampler's draw from the masked logits with the same seed, the reply parses and validates
  against the schema (the jsonschema package), and speculation does not change them;
- the engine gives each constrained request what it gets alone, and the server's
  response_format / json_schema / grammar and the CLI's --json-schema / --grammar do the same.
"""
import json
import subprocess

import jsonschema
import numpy as np
import pytest

from conftest import cli_env, kwker_bin, smollm2_gguf, SHARED_DATA
from kwker.decode import KwkDecoder
from kwker.grammar import Grammar, GrammarVocab, Matcher
from kwker.sampling import Sampler
from kwker.tokenizer import Tokenizer

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
PROMPT = "Describe a person as JSON with a name, an age and a city."


@pytest.fixture(scope="module")
def dec():
    d = KwkDecoder(smollm2_gguf(), max_cache_len=512, n_threads=2)
    yield d
    d.close()


@pytest.fixture(scope="module")
def tok(dec):
    return dec.tokenizer()


@pytest.fixture(scope="module")
def vocab(tok):
    return GrammarVocab(tok)


def chat_ids(tok, text):
    from kwker.template import ChatTemplate
    t = ChatTemplate(tok.chat_template)
    prompt = t.render({"messages": [{"role": "user", "content": text}],
                       "add_generation_prompt": True, "bos_token": tok.bos_token,
                       "eos_token": tok.eos_token})
    return tok.encode(prompt, add_special_tokens=False)


# ---- token bytes -----------------------------------------------------------------------------

TEXT = 'Hello world, {"a": [1, 2.5e-3]} héllo 中文 🙂 龘𝔘🦜ꙮ tabs\tand\nnewlines'


@pytest.mark.parametrize("where", ["smollm2", "gpt2", "llama3"])
def test_token_bytes_spell_the_text(where):
    """Byte-level BPE: the tokens of a text give its bytes back, multi-byte characters split
    across tokens included (raw bytes, no U+FFFD)."""
    path = {"smollm2": smollm2_gguf(), "gpt2": SHARED_DATA / "tokenizers" / "gpt2",
            "llama3": SHARED_DATA / "tokenizers" / "llama3"}[where]
    if where == "llama3":
        import gzip
        import tempfile
        src = SHARED_DATA / "tokenizers" / "llama3" / "tokenizer.json.gz"
        tmp = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
        tmp.write(gzip.decompress(src.read_bytes()))
        tmp.close()
        path = tmp.name
    t = Tokenizer.from_pretrained(str(path))
    ids = t.encode(TEXT, add_special_tokens=False)
    parts = [t.token_bytes(i) for i in ids]
    assert b"".join(parts) == TEXT.encode()
    # some token holds part of a character: the bytes are raw, not repaired
    assert any(_partial_utf8(p) for p in parts)


def _partial_utf8(b):
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_token_bytes_sentencepiece():
    """SentencePiece (Llama 2): U+2581 is a space, <0xHH> its byte, mid-text (no strip)."""
    t = Tokenizer.from_pretrained(str(SHARED_DATA / "tokenizers" / "llama2-tinyllama"))
    ids = t.encode(TEXT, add_special_tokens=False)
    assert b"".join(t.token_bytes(i) for i in ids) == b" " + TEXT.encode()
    assert t.token_bytes(t.token_to_id("<0x0A>")) == b"\n"
    with pytest.raises(Exception):
        t.token_bytes(len(t) + 5)


# ---- masks -----------------------------------------------------------------------------------

def brute_mask(grammar, tok, text, n):
    out = np.zeros(n, dtype=bool)
    for i in range(n):
        if tok.is_special(i):
            continue
        b = tok.token_bytes(i)
        out[i] = bool(b) and grammar.match(text + b, prefix=True)
    return out


@pytest.mark.parametrize("text", [b"", b'{"name": "Al', b'{"name": "Ann", "age": 4',
                                  b'{"name": "Ann", "age": 42, "city": "'])
def test_mask_equals_brute_force(tok, vocab, text):
    g = Grammar.from_json_schema(PERSON)
    m = Matcher(g, vocab)
    assert m.accept_bytes(text)
    got = m.mask()
    ref = brute_mask(g, tok, text, len(vocab))
    diff = np.nonzero(got != ref)[0][:10]
    assert not len(diff), [(int(i), tok.token_bytes(i), bool(got[i])) for i in diff]
    assert ref.sum() > 0


def test_matcher_accepts_and_ends(tok, vocab):
    g = Grammar.from_gbnf('root ::= "yes" | "no"')
    m = Matcher(g, vocab)
    ids = tok.encode("yes", add_special_tokens=False)
    assert not m.done
    for i in ids:
        assert m.allows(i) and m.accept(i)
    assert m.done and m.finished
    assert not m.accept(ids[0])
    m.reset()
    assert not m.done


# ---- generation ------------------------------------------------------------------------------

def reference_greedy(dec, tok, vocab, grammar, ids, n_new, eos):
    """The decoder's raw logits, the matcher's mask, argmax: what constrained greedy must give."""
    m = Matcher(grammar, vocab)
    seq = list(ids)
    out = []
    for _ in range(n_new):
        logits = dec.forward(seq)[-1]
        allowed = np.zeros(len(logits), dtype=bool)
        allowed[:len(vocab)] = m.mask()
        if m.done:
            allowed[eos] = True
        t = int(np.argmax(np.where(allowed, logits, -np.inf)))
        out.append(t)
        if t in eos:
            break
        assert m.accept(t)
        seq.append(t)
        if m.finished:
            break
    return out


def test_greedy_equals_reference_loop(dec, tok, vocab):
    g = Grammar.from_json_schema(PERSON)
    ids = chat_ids(tok, PROMPT)
    eos = dec._eos_list(None)
    ref = reference_greedy(dec, tok, vocab, g, ids, 48, eos)
    r = dec.generate(ids, max_new_tokens=48, grammar=g, lookup=0, prompt_cache=False,
                     return_dict_in_generate=True)
    assert r.tokens == ref
    # n-gram lookup (speculation) checks each candidate under the grammar: the same tokens
    r2 = dec.generate(ids, max_new_tokens=48, grammar=g, lookup=8,
                      return_dict_in_generate=True)
    assert r2.tokens == ref


def test_greedy_reply_is_valid_json(dec, tok):
    ids = chat_ids(tok, PROMPT)
    r = dec.generate(ids, max_new_tokens=200, json_schema=PERSON, return_dict_in_generate=True)
    assert r.finish_reason == "stop", r.text
    obj = json.loads(r.text)
    jsonschema.validate(obj, PERSON)
    # unconstrained, the same model does not give this object (the constraint did the work)
    free = dec.generate(ids, max_new_tokens=60, return_dict_in_generate=True)
    assert free.text != r.text


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_sampled_reply_is_valid_json(dec, tok, seed):
    ids = chat_ids(tok, PROMPT)
    r = dec.generate(ids, max_new_tokens=200, do_sample=True, temperature=1.3, top_k=0,
                     seed=seed, json_schema=PERSON, return_dict_in_generate=True)
    assert r.finish_reason == "stop", r.text
    jsonschema.validate(json.loads(r.text), PERSON)


def test_sampled_tokens_are_the_masked_draw(dec, tok, vocab):
    """Each sampled token is the sampler's seeded draw from the logits with the disallowed
    tokens at -inf (top-k / top-p after the mask), token for token."""
    g = Grammar.from_json_schema(PERSON)
    ids = chat_ids(tok, PROMPT)
    eos = dec._eos_list(None)
    kw = dict(do_sample=True, temperature=0.9, top_k=20, top_p=0.9, seed=77)
    r = dec.generate(ids, max_new_tokens=24, grammar=g, lookup=0,
                     return_dict_in_generate=True, **kw)
    s = Sampler(dec.vocab_size, eos_token_id=eos, **kw)
    for t in ids:
        s.accept(t, prompt=True)
    m = Matcher(g, vocab)
    seq = list(ids)
    for t in r.tokens:
        logits = dec.forward(seq)[-1]
        allowed = np.zeros(len(logits), dtype=bool)
        allowed[:len(vocab)] = m.mask()
        if m.done:
            allowed[eos] = True
        want, _, _ = s.sample(np.where(allowed, logits, -np.inf).astype(np.float32))
        assert t == want
        s.accept(t)
        if t in eos:
            break
        assert m.accept(t)
        seq.append(t)


def test_logprobs_stay_raw(dec, tok):
    ids = chat_ids(tok, PROMPT)
    r = dec.generate(ids, max_new_tokens=6, json_schema=PERSON, logprobs=True,
                     return_dict_in_generate=True, lookup=0)
    seq = list(ids)
    for t, lp in zip(r.tokens, r.logprobs):
        logits = dec.forward(seq)[-1].astype(np.float64)
        ref = logits[t] - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert abs(lp - ref) < 1e-4
        seq.append(t)


def test_eos_only_at_a_whole_sentence(dec, tok):
    """An eos id that is also an ordinary token (here ',' and ' "') is refused until the JSON is
    whole: the reply does not stop half-way."""
    ids = chat_ids(tok, PROMPT)
    extra = [tok.encode(",", add_special_tokens=False)[0],
             tok.encode(' "', add_special_tokens=False)[0]]
    for kw in (dict(), dict(do_sample=True, temperature=1.0, top_k=0, seed=5)):
        r = dec.generate(ids, max_new_tokens=200, json_schema=PERSON, lookup=0,
                         eos_token_id=dec._eos_list(None) + extra,
                         return_dict_in_generate=True, **kw)
        assert r.finish_reason == "stop", r.text
        jsonschema.validate(json.loads(r.text), PERSON)


def test_gbnf_grammar_and_finish(dec, tok):
    ids = chat_ids(tok, "Is the sky blue? Answer yes or no.")
    r = dec.generate(ids, max_new_tokens=20, grammar='root ::= ("yes" | "no") "."',
                     return_dict_in_generate=True)
    assert r.text in ("yes.", "no.")
    assert r.finish_reason == "stop"
    with pytest.raises(Exception) as e:
        dec.generate(ids, grammar='root ::= "a')
    assert "line 1" in str(e.value) or "col" in str(e.value)


def test_engine_requests_equal_alone(dec, tok):
    """Eight constrained requests at once (different schemas and seeds) give each what it gets
    alone (kernels are batch invariant; the mask is per request)."""
    ids = chat_ids(tok, PROMPT)
    schemas = [PERSON, {"type": "array", "items": {"type": "integer"}, "maxItems": 4},
               {"type": "object", "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"]}]
    kws = [dict(json_schema=schemas[i % 3], seed=i, do_sample=bool(i % 2), temperature=1.0,
                top_k=0, max_new_tokens=40) for i in range(8)]
    alone = [dec.generate(ids, return_dict_in_generate=True, lookup=0, **kw).tokens
             for kw in kws]
    eng = dec.engine()
    reqs = [eng.submit(ids, **kw) for kw in kws]  # with n-gram lookup: the same tokens
    for r in reqs:
        r.result()
    assert [r.tokens for r in reqs] == alone
    for r in reqs:
        if r.finish_reason == "stop":
            jsonschema.validate(json.loads(r.text), kws[reqs.index(r)]["json_schema"])


# ---- CLI ---------------------------------------------------------------------------------------

def test_cli_json_schema(tmp_path):
    f = tmp_path / "person.json"
    f.write_text(json.dumps(PERSON))
    p = subprocess.run([kwker_bin(), "generate", "--model", smollm2_gguf(), "--chat", PROMPT,
                        "--json-schema-file", str(f), "-n", "200", "-t", "2"],
                       capture_output=True, text=True, env=cli_env(), timeout=600)
    assert p.returncode == 0, p.stderr
    jsonschema.validate(json.loads(p.stdout), PERSON)
    bad = subprocess.run([kwker_bin(), "generate", "--model", smollm2_gguf(), "--prompt", "x",
                          "--json-schema", '{"type": "array", "uniqueItems": true}'],
                         capture_output=True, text=True, env=cli_env(), timeout=600)
    assert bad.returncode != 0 and "uniqueItems" in bad.stderr
    gb = subprocess.run([kwker_bin(), "generate", "--model", smollm2_gguf(), "--prompt",
                         "Count: one, two,", "--grammar", 'root ::= " three" [,.]', "-n", "10"],
                        capture_output=True, text=True, env=cli_env(), timeout=600)
    assert gb.returncode == 0, gb.stderr
    assert gb.stdout.rstrip("\n").endswith(" three.") or gb.stdout.rstrip("\n").endswith(
        " three,")


# ---- server ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def srv():
    from test_server import KEY, Server
    s = Server("--api-key", KEY, "--max-batch", 4, "--max-cache-len", 1024)
    yield s
    s.stop()


def test_server_response_format(srv, dec, tok):
    from test_server import request
    client = srv.client()
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": PROMPT}]
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                 "strict": True}}
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=200,
                                       temperature=0, response_format=rf)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), PERSON)
    # the library's constrained greedy reply to the same chat prompt
    lib = dec.generate(chat_ids(tok, PROMPT), max_new_tokens=200, json_schema=PERSON,
                       return_dict_in_generate=True)
    assert text == lib.text
    # streamed: the same text in pieces
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=msgs, max_tokens=200, temperature=0, response_format=rf,
        stream=True) if c.choices]
    assert "".join(parts) == text
    # json_object: any JSON object
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=120,
                                       temperature=0.8, seed=3,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: still a prefix of an object
        assert r.choices[0].message.content.lstrip().startswith("{")
    # llama.cpp's fields: "json_schema" and "grammar", on /v1/completions too
    status, body = request(srv.port, "POST", "/v1/completions", body={
        "model": model, "prompt": "The answer is", "max_tokens": 8, "temperature": 0,
        "grammar": 'root ::= " " ("yes" | "no") "."'})
    assert status == 200, body
    assert body["choices"][0]["text"] in (" yes.", " no.")
    status, body = request(srv.port, "POST", "/v1/chat/completions", body={
        "model": model, "messages": msgs, "max_tokens": 60, "temperature": 0,
        "json_schema": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}})
    assert status == 200, body
    content = body["choices"][0]["message"]["content"]
    if body["choices"][0]["finish_reason"] == "stop":
        arr = json.loads(content)
        assert isinstance(arr, list) and len(arr) <= 3 and all(isinstance(x, int) for x in arr)


def test_server_bad_schema_names_keyword(srv):
    from test_server import request
    client = srv.client()
    model = client.models.list().data[0].id
    status, body = request(srv.port, "POST", "/v1/chat/completions", body={
        "model": model, "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}}})
    assert status == 400
    err = body["error"]
    assert err["param"] == "response_format.json_schema.schema"
    assert "uniqueItems" in err["message"] and "/properties/a" in err["message"]
