"""Generation on top of the decoder: exact speculation (n-gram lookup, draft model), prompt reuse
across chat turns, stop strings, finish reasons and seeded sampling.

The reference for every speculative or cached run is the plain greedy path
(KwkDecoder.generate_greedy: no lookup, no reuse), itself checked against transformers by
test_decode_oracle.py. Kernels are batch invariant (src/kernels/kernels.h), so equality here is
exact, not approximate.
"""

import numpy as np
import pytest

import kwker
import tiny_models
from conftest import smollm2_gguf


@pytest.fixture(scope="module")
def smol():
    dec = kwker.KwkDecoder(smollm2_gguf(), max_cache_len=1024)
    yield dec
    dec.close()


def chat(user, history=()):
    text = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    for u, a in history:
        text += "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n%s<|im_end|>\n" % (u, a)
    return text + "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n" % user


QUOTING = "Repeat exactly: the cat sat on the mat, the cat sat on the mat, and the dog ran."


@pytest.mark.parametrize("name", ["llama_odd", "mistral_sw8", "qwen2", "qwen3"])
def test_lookup_is_exact_on_tiny_models(name):
    path = tiny_models.build(name)
    dec = kwker.KwkDecoder(str(path), max_cache_len=256, n_threads=2)
    rng = np.random.default_rng(5)
    vocab = dec.vocab_size
    for trial in range(3):
        base = rng.integers(0, vocab, size=6).tolist()
        prompt = base * 3 + rng.integers(0, vocab, size=3).tolist()  # repeats for lookup to find
        ref = dec.generate_greedy(prompt, max_new_tokens=40, eos_token_id=[])
        got = dec.generate(prompt, max_new_tokens=40, eos_token_id=[], lookup=8,
                           prompt_cache=False)
        assert got == ref, "lookup changed the greedy tokens (%s, trial %d)" % (name, trial)
        assert dec.stats["generated"] == 40
        assert dec.stats["finish_reason"] == "length"
        assert dec.stats["accepted"] <= dec.stats["proposed"]
        # one pass checks the pending token plus its candidates: steps + accepted covers 40 - 1
        assert dec.stats["steps"] + dec.stats["accepted"] == 39
    dec.close()


def test_lookup_proposes_and_keeps_on_quoting_prompt(smol):
    tok = smol.tokenizer()
    ids = tok.encode(chat(QUOTING))
    ref = smol.generate_greedy(ids, max_new_tokens=40)
    got = smol.generate(ids, max_new_tokens=40, lookup=8, prompt_cache=False)
    assert got == ref
    assert smol.stats["accepted"] > 0, smol.stats
    assert smol.stats["steps"] < smol.stats["generated"], smol.stats


def test_draft_model_is_exact():
    target = kwker.KwkDecoder(str(tiny_models.build("llama_tied")), max_cache_len=256)
    draft = kwker.KwkDecoder(str(tiny_models.build("llama_bf16")), max_cache_len=256)
    assert target.vocab_size == draft.vocab_size
    rng = np.random.default_rng(11)
    for _ in range(3):
        prompt = rng.integers(0, target.vocab_size, size=12).tolist()
        ref = target.generate_greedy(prompt, max_new_tokens=32, eos_token_id=[])
        got = target.generate(prompt, max_new_tokens=32, eos_token_id=[], draft=draft,
                              n_draft=4, prompt_cache=False)
        assert got == ref
        assert target.stats["proposed"] > 0
    # the same model as its own draft (a second decoder) has every proposal kept
    twin = kwker.KwkDecoder(str(tiny_models.build("llama_bf16")), max_cache_len=256)
    got = draft.generate(prompt, max_new_tokens=32, eos_token_id=[], draft=twin, n_draft=4,
                         prompt_cache=False)
    assert got == draft.generate_greedy(prompt, max_new_tokens=32, eos_token_id=[])
    assert draft.stats["accepted"] == draft.stats["proposed"] > 0
    with pytest.raises(kwker.KwkError, match="draft"):
        draft.generate(prompt, max_new_tokens=4, draft=draft)
    twin.close()
    target.close()
    draft.close()


def test_prompt_reuse_across_chat_turns(smol):
    tok = smol.tokenizer()
    turns = ["What is the capital of France?", "And of Italy?", "Which one is larger?"]
    history = []
    fresh = kwker.KwkDecoder(smollm2_gguf(), max_cache_len=1024)
    smol.generate(tok.encode(chat("warm-up")), max_new_tokens=2)  # unrelated cache content
    for user in turns:
        ids = tok.encode(chat(user, history))
        before = smol.cached_tokens()  # the cache: earlier prompt + reply (its last token unread)
        out = smol.generate(ids, max_new_tokens=24, prompt_cache=True)
        reused = smol.stats["prompt_reused"]
        ref = fresh.generate(ids, max_new_tokens=24, prompt_cache=False)
        assert out == ref, "prompt reuse changed the reply at turn %r" % user
        assert fresh.stats["prompt_reused"] == 0
        common = 0
        while common < min(len(before), len(ids) - 1) and before[common] == ids[common]:
            common += 1
        assert reused == common
        reply = tok.decode(out[len(ids):], skip_special_tokens=True)
        history.append((user, reply))
    assert reused > len(ids) // 2  # the last turn re-read only its new message
    fresh.close()


def expected_stop(tok, tokens, stops):
    """Reference: after each token, the first stop string complete in the text ends the reply,
    cut where the earliest complete stop starts."""
    for i in range(1, len(tokens) + 1):
        text = tok.decode(tokens[:i], skip_special_tokens=True)
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return text[: min(hits)], i
    return None, len(tokens)


@pytest.mark.parametrize("stops", [
    ["brown fo"],                  # inside a token run: split across token boundaries
    ["mat, the"],
    ["sat on", "cat sat"],         # overlapping stops: the one completed first wins
    ["zzz-never", "the dog"],
])
def test_stop_strings(smol, stops):
    tok = smol.tokenizer()
    prompt = "Repeat exactly: the quick brown fox; the cat sat on the mat, the cat sat on the dog."
    ids = tok.encode(chat(prompt))
    full = smol.generate_greedy(ids, max_new_tokens=48)[len(ids):]
    want_text, want_n = expected_stop(tok, full, stops)
    assert want_text is not None, "reference reply %r lacks the stops" % tok.decode(full)
    out = smol.generate(ids, max_new_tokens=48, stop=stops)
    assert smol.stats["finish_reason"] == "stop"
    assert smol.stats["text"] == want_text
    assert out[len(ids):] == full[:want_n]
    for s in stops:
        assert s not in smol.stats["text"]


def test_stop_at_the_very_start_and_unicode(smol):
    tok = smol.tokenizer()
    ids = tok.encode(chat("Write the word café three times."))
    full = smol.generate_greedy(ids, max_new_tokens=24)[len(ids):]
    first = tok.decode(full[:1], skip_special_tokens=True)
    smol.generate(ids, max_new_tokens=24, stop=[first[:1]])
    assert smol.stats["text"] == "" and smol.stats["finish_reason"] == "stop"
    text = tok.decode(full, skip_special_tokens=True)
    assert "é" in text, text
    smol.generate(ids, max_new_tokens=24, stop=["é"])
    assert smol.stats["text"] == text[: text.index("é")]


def test_streamed_text_concatenates_to_the_reply(smol):
    tok = smol.tokenizer()
    ids = tok.encode(chat("Name three colours, with an emoji for each."))
    pieces = []
    smol.generate(ids, max_new_tokens=40, stop=["zzz"], streamer=lambda t, s: pieces.append(s))
    assert "".join(pieces) == smol.stats["text"]
    for p in pieces:
        p.encode("utf-8")  # each piece is whole UTF-8 (no lone surrogates from a split)
    cancelled = []
    smol.generate(ids, max_new_tokens=40, streamer=lambda t, s: cancelled.append(t) or True)
    assert smol.stats["finish_reason"] == "canceled" and len(cancelled) == 1


def test_finish_reasons_and_eos(smol):
    tok = smol.tokenizer()
    ids = tok.encode(chat("Say hi."))
    out = smol.generate(ids, max_new_tokens=64)
    assert smol.stats["finish_reason"] == "stop"
    assert out[-1] in smol.eos_token_id
    smol.generate(ids, max_new_tokens=3)
    assert smol.stats["finish_reason"] == "length" and smol.stats["generated"] == 3
    # min_new_tokens suppresses eos until reached
    n_free = len(out) - len(ids)
    smol.generate(ids, max_new_tokens=n_free + 6, min_new_tokens=n_free + 2)
    assert smol.stats["generated"] >= n_free + 2


def test_seeded_sampling_same_with_and_without_lookup(smol):
    tok = smol.tokenizer()
    ids = tok.encode(chat(QUOTING))
    runs = []
    for lookup in (0, 8, 0):
        runs.append(smol.generate(ids, max_new_tokens=40, do_sample=True, temperature=0.9,
                                  top_p=0.95, seed=1234, lookup=lookup, prompt_cache=False))
    assert runs[0] == runs[1] == runs[2]
    for seed in (1, 2, 3):  # the same text too, for several seeds
        texts = []
        for lookup in (8, 0):
            smol.generate(ids, max_new_tokens=40, do_sample=True, temperature=0.7, seed=seed,
                          lookup=lookup, prompt_cache=False)
            texts.append(smol.stats["text"])
        assert texts[0] == texts[1] and texts[0], (seed, texts)
    other = smol.generate(ids, max_new_tokens=40, do_sample=True, temperature=0.9, top_p=0.95,
                          seed=99, lookup=0, prompt_cache=False)
    assert other != runs[0]


def log_softmax(rows):
    rows = np.asarray(rows, dtype=np.float64)
    m = rows.max(axis=-1, keepdims=True)
    return rows - m - np.log(np.exp(rows - m).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("name", ["llama_odd", "qwen3"])
@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_logprobs_match_transformers_raw_logits(name, mode):
    import torch
    path = tiny_models.build(name)
    hf = tiny_models.load_hf(path)
    dec = kwker.KwkDecoder(str(path), max_cache_len=256, n_threads=2)
    rng = np.random.default_rng(21)
    base = rng.integers(0, dec.vocab_size, size=5).tolist()
    prompt = base * 3 + rng.integers(0, dec.vocab_size, size=2).tolist()
    opt = dict(do_sample=True, temperature=1.3, top_k=40, seed=8) if mode == "sample" else {}
    k = 5
    # a twin of the model as draft: most tokens come from rows of batched verification passes
    twin = kwker.KwkDecoder(str(path), max_cache_len=256, n_threads=2)
    res = dec.generate(prompt, max_new_tokens=24, eos_token_id=[], draft=twin, logprobs=True,
                       top_logprobs=k, prompt_cache=False, **opt)
    twin.close()
    assert isinstance(res, kwker.decode.GenerateOutput)
    assert res.sequences == prompt + res.tokens and len(res.tokens) == 24
    assert res.finish_reason == "length"
    assert dec.stats["accepted"] > 0
    with torch.no_grad():
        ref = log_softmax(tiny_models.hf_logits(hf, res.sequences))[len(prompt) - 1:-1]
    want = ref[np.arange(24), res.tokens]
    np.testing.assert_allclose(res.logprobs, want, atol=1e-5, rtol=0)
    assert len(res.top_logprobs) == 24
    for j, top in enumerate(res.top_logprobs):
        ids_ = [t for t, _ in top]
        lps = np.array([lp for _, lp in top])
        assert len(top) == k and len(set(ids_)) == k
        assert np.all(np.diff(lps) <= 0), "top_logprobs not sorted"
        order = sorted(range(dec.vocab_size), key=lambda i: (-ref[j, i], i))[:k]
        # the same set as transformers' top k (ties within rounding may swap places)
        np.testing.assert_allclose(lps, np.sort(ref[j])[::-1][:k], atol=1e-5, rtol=0)
        assert set(ids_) == set(order) or np.ptp(ref[j][order[-1:] + ids_[-1:]]) < 1e-5
        # consistent with the chosen token's logprob
        if res.tokens[j] in ids_:
            assert abs(lps[ids_.index(res.tokens[j])] - res.logprobs[j]) < 1e-6
        else:
            assert res.logprobs[j] <= lps[-1] + 1e-6
        if mode == "greedy":
            assert ids_[0] == res.tokens[j]
    # the plain return is unchanged without logprobs, and the tokens are the same
    again = dec.generate(prompt, max_new_tokens=24, eos_token_id=[], lookup=0,
                         prompt_cache=False, **opt)
    assert again == res.sequences
    only = dec.generate(prompt, max_new_tokens=3, eos_token_id=[], logprobs=True)
    assert only.top_logprobs is None and only.logprobs.shape == (3,)
    with pytest.raises(ValueError):
        dec.generate(prompt, max_new_tokens=3, top_logprobs=21)
    dec.close()


def test_stats_text_without_an_explicit_tokenizer(smol):
    tok = smol.tokenizer()
    ids = tok.encode(chat("Say hi."))
    smol2 = kwker.KwkDecoder(smollm2_gguf(), max_cache_len=256)
    out = smol2.generate(ids, max_new_tokens=8)
    assert smol2.stats["text"] == tok.decode(out[len(ids):], skip_special_tokens=True)
    smol2.close()
    # a model folder without a tokenizer: no text, and no error
    dec = kwker.KwkDecoder(str(tiny_models.build("llama_tied")), max_cache_len=64)
    dec.generate([1, 2, 3], max_new_tokens=2)
    assert dec.stats["text"] is None
    with pytest.raises(kwker.KwkError):
        dec.generate([1, 2, 3], max_new_tokens=2, stop=["x"])
    dec.close()


def test_int4_draft_of_smollm2_is_exact(smol):
    """The same checkpoint at int4 is a real draft for the preserve decoder (same tokenizer,
    ~5x fewer weight bytes): greedy output identical, most proposals kept."""
    tok = smol.tokenizer()
    draft = kwker.KwkDecoder(smollm2_gguf(), max_cache_len=1024, precision="int4")
    for user in (QUOTING, "Explain how photosynthesis works to a ten-year-old."):
        ids = tok.encode(chat(user))
        ref = smol.generate_greedy(ids, max_new_tokens=40)
        got = smol.generate(ids, max_new_tokens=40, lookup=0, draft=draft, n_draft=4,
                            prompt_cache=False)
        assert got == ref
        assert 0 < smol.stats["accepted"] <= smol.stats["proposed"]
        assert smol.stats["steps"] < smol.stats["generated"]
    draft.close()
