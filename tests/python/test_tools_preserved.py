"""Tool calls whose markers are special tokens of the model's vocabulary (preserved tokens,
llama.cpp's preserved_tokens), end to end through `kwker serve`.

A tiny random Llama whose tokenizer is GPT-2's byte-level BPE plus the special added tokens
[TOOL_CALLS], <|python_tag|>, <tool_call> and </tool_call> (as Mistral Nemo, Llama 3.1 and some
Hermes / Qwen vocabularies hold them: one control token each, which a skip_special decode drops)
is served with the real templates llama.cpp keeps: Mistral Nemo's and Qwen 2.5's (Hermes).

- Hugging Face reads each marker as one special token, which decode(skip_special_tokens=True)
  drops: without preserving it the reply reader never saw it.
- tool_choice "required": the grammar, which starts with the marker's text, takes the one
  special token (a logit bias makes the model want it; the reply's first logprob is that one
  token), and the reply is read back into tool_calls whose arguments validate; streamed, no
  marker reaches the content and the deltas add up to the same calls.
- tool_choice "auto": the special marker token sets the lazy grammar off (the reply is calls),
  where without the bias the same model writes plain text.
The pieces (detokenizer, grammar vocabulary, trigger, which markers a format preserves) are
tests/c/test_preserved.c and tests/c/test_toolcall_preserved.c.
"""
import json
from types import SimpleNamespace

import jsonschema
import pytest

from conftest import SHARED_DATA
from test_tools import serve

GPT2 = SHARED_DATA / "tokenizers" / "gpt2"
TEMPLATES = SHARED_DATA / "chat-templates" / "llamacpp"
MARKERS = ["[TOOL_CALLS]", "<|python_tag|>", "<tool_call>", "</tool_call>"]
FORMATS = {  # format -> (template, the marker that opens a call)
    "mistral_nemo": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "[TOOL_CALLS]"),
    "hermes": ("Qwen-Qwen2.5-7B-Instruct.jinja", "<tool_call>"),
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 40},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"], "additionalProperties": False}}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


def hf_tokenizer():
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    t = Tokenizer(models.BPE.from_file(str(GPT2 / "encoder.json"), str(GPT2 / "vocab.bpe")))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<|endoftext|>",
                                               eos_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": MARKERS})
    return tok


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """The tiny checkpoint: tokenizer above, a random 2-layer Llama saved by transformers."""
    import torch
    import transformers
    out = tmp_path_factory.mktemp("preserved") / "tiny-markers"
    tok = hf_tokenizer()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(out)
    tok.save_pretrained(out)
    return SimpleNamespace(path=out, tok=tok)


@pytest.fixture(scope="module", params=sorted(FORMATS))
def server(request, ckpt):
    template, marker = FORMATS[request.param]
    gen = serve("--model", ckpt.path, "--chat-template-file", TEMPLATES / template)
    srv = next(gen)
    srv.format, srv.marker = request.param, marker
    srv.marker_id = ckpt.tok.convert_tokens_to_ids(marker)
    srv.model = ckpt.path.name
    yield srv
    next(gen, None)


def test_markers_are_special_tokens(ckpt):
    """What the gap was: Hugging Face reads each marker as one special token, and a
    skip_special decode (the server's) drops it; kwker's tokenizer agrees on both."""
    import kwker
    tok = ckpt.tok
    ktok = kwker.Tokenizer(str(ckpt.path))
    for m in MARKERS:
        ids = tok.encode("a" + m + "b", add_special_tokens=False)
        assert len(ids) == 3 and ids[1] in tok.all_special_ids, (m, ids)
        assert ktok.encode("a" + m + "b", add_special_tokens=False) == ids
        assert tok.decode(ids, skip_special_tokens=True) == "ab"
        assert tok.decode(ids, skip_special_tokens=False) == "a" + m + "b"
        assert ktok.decode(ids, skip_special_tokens=True) == "ab"
        assert ktok.decode(ids, skip_special_tokens=False) == "a" + m + "b"


def ask(srv, choice, stream=False, bias=True, **kw):
    c = srv.client()
    return c.chat.completions.create(
        model=srv.model, messages=MESSAGES, tools=[WEATHER], tool_choice=choice,
        parallel_tool_calls=False, max_tokens=200, temperature=0, stream=stream,
        logit_bias={str(srv.marker_id): 100} if bias else None, **kw)


def check_call(call):
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments),
                        WEATHER["function"]["parameters"])


def check_reply(srv, r, tok):
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert ch.message.tool_calls and len(ch.message.tool_calls) == 1, ch.message
    check_call(ch.message.tool_calls[0])
    assert not ch.message.content
    # the reply opened with the one special token (not the marker spelled in plain tokens)
    toks = [t.token for t in ch.logprobs.content]
    assert toks[0] == srv.marker, toks[:4]
    assert list(ch.logprobs.content[0].bytes) == list(srv.marker.encode())
    # Hugging Face reads the reply's text (every token's own decode) back into the same
    # special token first, and decodes its ids (special tokens kept) to that text
    text = "".join(toks)
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == srv.marker_id
    assert tok.decode(ids, skip_special_tokens=False) == text
    return ch.message.tool_calls


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_call_through_special_marker(server, ckpt, choice):
    """The marker's one special token opens the call ("required": the grammar takes it;
    "auto": it sets the lazy grammar off), and the reply is read back into a call."""
    r = ask(server, choice, logprobs=True)
    check_reply(server, r, ckpt.tok)


def test_required_without_bias(server, ckpt):
    """The model's own choice under "required": the marker as its token or spelled, a call."""
    r = ask(server, "required", bias=False)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1, ch
    check_call(ch.message.tool_calls[0])


def test_auto_without_marker_is_text(server):
    """Without the bias this model never opens a call under "auto": plain content, the
    grammar never fired (so the call above came from the special token)."""
    r = ask(server, "auto", bias=False, logprobs=True)
    ch = r.choices[0]
    assert not ch.message.tool_calls and ch.message.content
    assert server.marker not in [t.token for t in ch.logprobs.content]


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_streamed(server, choice):
    """Streamed: no content delta holds the marker (or any of it), and the calls' deltas add
    up to the calls of the reply not streamed (ids aside: made per request but Mistral's)."""
    whole = ask(server, choice).choices[0].message.tool_calls
    content, calls, finish = "", {}, None
    for chunk in ask(server, choice, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            c["id"] = tc.id or c["id"]
            if tc.function:
                c["name"] += tc.function.name or ""
                c["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert content == "", content
    assert all(c["id"] for c in calls.values())  # made per request, but Mistral's
    assert [(c["name"], c["arguments"]) for c in calls.values()] == \
        [(w.function.name, w.function.arguments) for w in whole]


def test_decoder_preserved_ids(ckpt):
    """The binding's preserved_ids: the reply's text is Hugging Face's decode of its tokens with
    the preserved one kept (and other special tokens dropped); the grammar takes the marker's
    token and its trigger sees it. Without it the same tokens' text loses the marker."""
    import kwker
    tok = ckpt.tok
    mid = tok.convert_tokens_to_ids("[TOOL_CALLS]")
    ids = tok.encode("Weather in Paris?", add_special_tokens=False)
    g = 'root ::= "[TOOL_CALLS]" "[" [a-z]{1,8} "]"'
    with kwker.KwkDecoder(str(ckpt.path), max_cache_len=128) as dec:
        outs = {}
        for pres in ([mid], None):
            r = dec.generate(ids, max_new_tokens=24, grammar=g, grammar_trigger="[TOOL_CALLS]",
                             logit_bias={mid: 100.0}, preserved_ids=pres, eos_token_id=[],
                             return_dict_in_generate=True)
            outs[bool(pres)] = r
        kept, dropped = outs[True], outs[False]
        assert int(kept.tokens[0]) == mid
        assert kept.text.startswith("[TOOL_CALLS][") and kept.text.endswith("]")
        assert kept.finish_reason == "stop"  # the grammar's whole sentence
        assert kept.text == tok.decode(
            [int(t) for t in kept.tokens if int(t) == mid or int(t) not in tok.all_special_ids])
        # not preserved: the marker is chosen (free text) but adds nothing, the grammar never
        # starts (the biased marker is chosen again and again), and the text is the
        # skip_special decode (empty here: None)
        assert int(dropped.tokens[0]) == mid and dropped.finish_reason == "length"
        assert (dropped.text or "") == tok.decode([int(t) for t in dropped.tokens],
                                                  skip_special_tokens=True)
        assert "[TOOL_CALLS]" not in (dropped.text or "")
