"""The serving engine from Python (kwker.serve): requests batched together get exactly the tokens
KwkDecoder.generate gives each alone (greedy and seeded sampling, tiny random models and
SmolLM2-135M-Instruct), streaming order, cancellation, asyncio, stop strings, errors, and
KwkDecoder.generate_batch.

The reference is KwkDecoder.generate on one sequence (itself checked against transformers and
the plain greedy path by test_generate.py / test_decode_oracle.py); kernels are batch invariant,
so equality is exact.
"""
import asyncio

import numpy as np
import pytest

import kwker
import tiny_models
from kwker.serve import Engine
from conftest import smollm2_gguf


def chat(user):
    return ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n" % user)


def mixed_options(i):
    """Per-request options: greedy and seeded sampling side by side in one batch."""
    if i % 2 == 0:
        return {}
    return dict(do_sample=True, temperature=0.8 + 0.1 * (i % 3), top_p=0.9, seed=100 + i)


@pytest.fixture(scope="module")
def tiny():
    dec = kwker.KwkDecoder(str(tiny_models.build("llama_odd")), max_cache_len=256, n_threads=2)
    yield dec
    dec.close()


def tiny_prompts(dec, n=8, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        base = rng.integers(0, dec.vocab_size, size=int(rng.integers(2, 6))).tolist()
        # some repeat (lookup has something to copy), all differ in length
        out.append(base * (1 + i % 3) + rng.integers(0, dec.vocab_size, size=i + 1).tolist())
    return out


@pytest.mark.parametrize("name", ["llama_odd", "qwen3", "mistral_sw8", "gemma3"])
def test_eight_requests_equal_alone_tiny(name):
    dec = kwker.KwkDecoder(str(tiny_models.build(name)), max_cache_len=256, n_threads=2)
    prompts = tiny_prompts(dec)
    alone = []
    for i, p in enumerate(prompts):
        res = dec.generate(p, max_new_tokens=24, eos_token_id=[], logprobs=True, top_logprobs=3,
                           prompt_cache=False, **mixed_options(i))
        alone.append(res)
    with Engine(dec, max_batch=8) as eng:
        reqs = [eng.submit(p, max_new_tokens=24, eos_token_id=[], top_logprobs=3,
                           **mixed_options(i)) for i, p in enumerate(prompts)]
        eng.run_until_done()
        st = eng.stats
        for i, (r, a) in enumerate(zip(reqs, alone)):
            assert r.done and r.error is None
            assert r.tokens == a.tokens, "request %d differs from its run alone" % i
            assert r.finish_reason == "length"
            np.testing.assert_allclose(r.logprobs, a.logprobs, atol=1e-6, rtol=0)
            assert [[t for t, _ in row] for row in r.top_logprobs] == \
                [[t for t, _ in row] for row in a.top_logprobs]
        assert st["completed"] == 8 and st["generated_tokens"] == 8 * 24
        assert st["running"] == 0 and st["queued"] == 0
        # several requests shared steps: fewer passes than tokens
        assert st["steps"] < 8 * 24
    dec.close()


def test_more_requests_than_slots_and_generate_batch(tiny):
    prompts = tiny_prompts(tiny, n=11, seed=7)
    alone = [tiny.generate(p, max_new_tokens=12, eos_token_id=[], **mixed_options(i))
             for i, p in enumerate(prompts)]
    with Engine(tiny, max_batch=3) as eng:
        reqs = [eng.submit(p, max_new_tokens=12, eos_token_id=[], **mixed_options(i))
                for i, p in enumerate(prompts)]
        assert eng.stats["queued"] == 11
        for r, a, p in zip(reqs, alone, prompts):
            assert p + r.result() == a  # result() steps the engine on this thread
    dec = kwker.KwkDecoder(tiny.model_path, max_cache_len=256, n_threads=2, max_batch=4)
    outs = dec.generate_batch(prompts[:4], 12, eos_token_id=[])
    assert outs == [tiny.generate(p, max_new_tokens=12, eos_token_id=[]) for p in prompts[:4]]
    # numpy in, numpy out, as generate does
    arr = dec.generate_batch([np.asarray(prompts[0], dtype=np.int64)], 12, eos_token_id=[])[0]
    assert isinstance(arr, np.ndarray) and arr.tolist() == outs[0]
    dec.close()


def test_streaming_order_and_incremental(tiny):
    p = tiny_prompts(tiny, n=1, seed=3)[0]
    alone = tiny.generate(p, max_new_tokens=40, eos_token_id=[], lookup=0)[len(p):]
    with Engine(tiny, max_batch=2) as eng:
        r = eng.submit(p, max_new_tokens=40, eos_token_id=[], lookup=0)
        other = eng.submit(p[:3], max_new_tokens=40, eos_token_id=[], lookup=0)
        seen, done_at_first = [], None
        for t in r:  # each wait runs one step on this thread: tokens come one at a time
            if done_at_first is None:
                done_at_first = r.done
            seen.append(t)
        assert seen == alone == r.tokens
        assert done_at_first is False
        assert other.result() == tiny.generate(p[:3], max_new_tokens=40, eos_token_id=[],
                                               lookup=0)[3:]
        # with the engine's own thread: the same stream
        eng.start()
        assert eng.running
        r2 = eng.submit(p, max_new_tokens=40, eos_token_id=[], lookup=0)
        assert list(r2) == alone
        with pytest.raises(RuntimeError):
            eng.step()
        eng.stop()
        assert not eng.running


def test_cancel_running_and_queued(tiny):
    p = tiny_prompts(tiny, n=1, seed=5)[0]
    full = tiny.generate(p, max_new_tokens=60, eos_token_id=[], lookup=0)[len(p):]
    with Engine(tiny, max_batch=1) as eng:
        r = eng.submit(p, max_new_tokens=60, eos_token_id=[], lookup=0)
        queued = eng.submit(p, max_new_tokens=60, eos_token_id=[])
        got = []
        for t in r:
            got.append(t)
            if len(got) == 3:
                assert r.cancel()
        assert r.finish_reason == "canceled"
        assert 3 <= len(r.tokens) < 60 and r.tokens == full[:len(r.tokens)]
        assert queued.cancel()
        assert queued.result() == [] and queued.finish_reason == "canceled"
        assert not r.cancel()  # already done
        eng.run_until_done()
        st = eng.stats
        assert st["canceled"] == 2 and st["running"] == 0 and st["queued"] == 0
        # the slot is free again: a new request runs to the end
        assert eng.submit(p, max_new_tokens=8, eos_token_id=[], lookup=0).result() == full[:8]


def test_threads_submit_and_stream_while_the_engine_runs(tiny):
    import threading
    prompts = tiny_prompts(tiny, n=6, seed=13)
    alone = [tiny.generate(p, max_new_tokens=16, eos_token_id=[], **mixed_options(i))[len(p):]
             for i, p in enumerate(prompts)]
    got = [None] * len(prompts)
    with Engine(tiny, max_batch=4) as eng:
        eng.start()

        def worker(k):
            for i in range(k, len(prompts), 3):
                got[i] = list(eng.submit(prompts[i], max_new_tokens=16, eos_token_id=[],
                                         **mixed_options(i)))
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        # a long request canceled from another thread while this one streams it
        r = eng.submit(prompts[0], max_new_tokens=200, eos_token_id=[])
        canceler = threading.Timer(0.05, r.cancel)
        canceler.start()
        n = len(list(r))
        canceler.join()
        assert r.finish_reason in ("canceled", "length") and n == len(r.tokens)
    assert got == alone


def test_close_ends_pending_requests(tiny):
    eng = Engine(tiny, max_batch=2)
    reqs = [eng.submit([1, 2, 3], max_new_tokens=10) for _ in range(3)]
    eng.close()
    for r in reqs:
        assert r.done and r.finish_reason == "canceled" and r.tokens == []
    with pytest.raises(kwker.KwkError):
        eng.submit([1, 2, 3])
    # closing the decoder first closes the engines over its model
    dec = kwker.KwkDecoder(tiny.model_path, max_cache_len=64)
    eng = Engine(dec, max_batch=2)
    r = eng.submit([1, 2, 3], max_new_tokens=10)
    dec.close()
    assert r.done and r.finish_reason == "canceled"
    with pytest.raises(kwker.KwkError):
        eng.submit([1, 2, 3])


def test_asyncio_streams_and_results(tiny):
    prompts = tiny_prompts(tiny, n=4, seed=9)
    alone = [tiny.generate(p, max_new_tokens=20, eos_token_id=[], **mixed_options(i))[len(p):]
             for i, p in enumerate(prompts)]

    async def main(eng):
        reqs = [eng.submit(p, max_new_tokens=20, eos_token_id=[], **mixed_options(i))
                for i, p in enumerate(prompts)]

        async def stream(r):
            return [t async for t in r]
        streamed = await asyncio.gather(*[stream(r) for r in reqs[:2]])
        results = await asyncio.gather(*[r.aresult() for r in reqs[2:]])
        return streamed + results

    with Engine(tiny, max_batch=4) as eng:
        got = asyncio.run(main(eng))  # starts the engine's thread
        assert eng.running
    assert got == alone


def test_prompt_beyond_the_cache_is_an_error(tiny):
    with Engine(tiny, max_batch=2, max_cache_len=32) as eng:
        assert eng.max_cache_len == 32
        with pytest.raises(kwker.KwkError, match="does not fit"):
            eng.submit(list(range(1, 41)), max_new_tokens=4)
        with pytest.raises(kwker.KwkError, match="does not fit"):
            eng.submit(list(range(1, 21)), max_new_tokens=20)
        with pytest.raises(kwker.KwkError):
            eng.submit([1, 2, tiny.vocab_size], max_new_tokens=2)  # id out of range
        with pytest.raises(kwker.KwkError, match="temperature"):
            eng.submit([1, 2], do_sample=True, temperature=-1.0)
        with pytest.raises(kwker.KwkError, match="tokenizer"):
            eng.submit([1, 2], stop=["x"])  # the tiny model has no tokenizer
        # the engine still works after refused submissions
        r = eng.submit(list(range(1, 21)), max_new_tokens=12, eos_token_id=[])
        assert len(r.result()) == 12


def test_shared_prefix_penalties_eos_and_edges(tiny):
    rng = np.random.default_rng(3)
    system = rng.integers(0, tiny.vocab_size, size=60).tolist()
    prompts = [system + rng.integers(0, tiny.vocab_size, size=5).tolist() for _ in range(5)]
    alone = [tiny.generate(p, max_new_tokens=10, eos_token_id=[], prompt_cache=False)[len(p):]
             for p in prompts]
    eos = alone[0][3]
    opts = dict(do_sample=True, seed=5, repetition_penalty=1.3, presence_penalty=0.5,
                frequency_penalty=0.3, logit_bias={5: 3.0, 7: -2.0}, top_k=0, min_p=0.05)
    with Engine(tiny, max_batch=4) as eng:
        first = eng.submit(prompts[0], max_new_tokens=10, eos_token_id=[])
        eng.run_until_done()
        rest = [eng.submit(p, max_new_tokens=10, eos_token_id=[]) for p in prompts[1:]]
        eng.run_until_done()
        assert [r.tokens for r in [first] + rest] == alone
        # the shared 60-token prefix is read once (copied or kept, never re-read)
        assert first.prompt_reused == 0 and all(r.prompt_reused == 60 for r in rest)
        cases = [(prompts[0], dict(max_new_tokens=10, eos_token_id=[eos])),
                 (prompts[0], dict(max_new_tokens=10, eos_token_id=[eos], min_new_tokens=6)),
                 (prompts[1], dict(max_new_tokens=30, eos_token_id=[], **opts)),
                 ([4], dict(max_new_tokens=6, eos_token_id=[])),
                 (rng.integers(0, tiny.vocab_size, size=250).tolist(),
                  dict(max_new_tokens=6, eos_token_id=[]))]  # fills the 256-position slot
        reqs = [eng.submit(p, **kw) for p, kw in cases]
        eng.run_until_done()
        for (p, kw), r in zip(cases, reqs):
            ref = tiny.generate(p, **kw)
            assert r.tokens == ref[len(p):] and r.finish_reason == tiny.stats["finish_reason"]
        assert reqs[0].finish_reason == "stop" and reqs[1].finish_reason == "length"
        empty = eng.submit([1, 2, 3], max_new_tokens=0)
        assert empty.result() == [] and empty.finish_reason == "length"
        assert not eng.cancel(10 ** 9)


@pytest.fixture(scope="module")
def smol():
    dec = kwker.KwkDecoder(smollm2_gguf(), max_cache_len=512)
    yield dec
    dec.close()


SMOL_USERS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Repeat exactly: the cat sat on the mat, the cat sat on the mat.",
    "Name three primary colours.",
    "What is 12 times 7?",
    "Give me a synonym for happy.",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue? One sentence.",
]


def test_eight_requests_equal_alone_smollm2(smol):
    tok = smol.tokenizer()
    prompts = [tok.encode(chat(u)) for u in SMOL_USERS]
    alone, texts = [], []
    for i, p in enumerate(prompts):
        alone.append(smol.generate(p, max_new_tokens=24, prompt_cache=False,
                                   **mixed_options(i))[len(p):])
        texts.append(smol.stats["text"])
    with Engine(smol, max_batch=8) as eng:
        eng.start()
        reqs = [eng.submit(p, max_new_tokens=24, **mixed_options(i))
                for i, p in enumerate(prompts)]
        for i, (r, a, t) in enumerate(zip(reqs, alone, texts)):
            assert r.result(timeout=600) == a, "request %d (%r) differs from its run alone" % (
                i, SMOL_USERS[i])
            assert r.text == t
            assert r.finish_reason == ("stop" if a[-1] in smol.eos_token_id else "length")


def test_stop_strings_smollm2(smol):
    tok = smol.tokenizer()
    ids = tok.encode(chat("Repeat exactly: the quick brown fox; the cat sat on the mat."))
    stops = ["brown fo", "zzz"]
    ref = smol.generate(ids, max_new_tokens=40, stop=stops, prompt_cache=False)[len(ids):]
    assert smol.stats["finish_reason"] == "stop"
    want = smol.stats["text"]
    with Engine(smol, max_batch=2) as eng:
        r = eng.submit(ids, max_new_tokens=40, stop=stops)
        other = eng.submit(ids, max_new_tokens=40, stop="the cat")
        eng.run_until_done()
        assert r.tokens == ref and r.text == want and r.finish_reason == "stop"
        assert "brown fo" not in r.text
        assert other.finish_reason == "stop" and "the cat" not in other.text


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("max_batch", [1, 3])
def test_prompt_logprobs(tiny, max_batch):
    """submit(prompt_logprobs=True): each prompt token's logprob given those before it, the
    log-softmax of KwkDecoder.forward's logits at the position before; read over several steps
    (a step holds at most max_batch * 9 rows with logits), beside requests without them, whose
    tokens do not change; the generated tokens are those the request gets without them."""
    prompts = tiny_prompts(tiny, n=4, seed=11)
    prompts[0] = prompts[0] * 6  # longer than a step's logits rows
    with Engine(tiny, max_batch=max_batch, prefill_chunk=64) as eng:
        plain = [eng.submit(p, max_new_tokens=6, eos_token_id=[]) for p in prompts]
        eng.run_until_done()
        reqs = [eng.submit(p, max_new_tokens=6, eos_token_id=[], top_logprobs=3,
                           prompt_logprobs=i % 2 == 0) for i, p in enumerate(prompts)]
        eng.run_until_done()
    for i, (r, a, p) in enumerate(zip(reqs, plain, prompts)):
        assert r.error is None and r.tokens == a.tokens
        if i % 2:
            assert r.prompt_logprobs is None
            continue
        want = log_softmax(tiny.forward(p))
        assert r.prompt_logprobs[0] is None and r.prompt_top_logprobs[0] is None
        assert len(r.prompt_logprobs) == len(p)
        got = np.array(r.prompt_logprobs[1:])
        np.testing.assert_allclose(got, want[np.arange(len(p) - 1), p[1:]], atol=2e-5, rtol=0)
        for k in range(1, len(p)):
            top = [t for t, _ in r.prompt_top_logprobs[k]]
            assert top == np.argsort(-want[k - 1], kind="stable")[:3].tolist()
        # the prompt is read whole: nothing reused, even where a slot held it
        assert r.prompt_reused == 0



def test_prompt_logprobs_beside_a_short_prompt(tiny):
    """A scored prompt longer than a step's logits rows and a plain short prompt finishing in the
    same step (helper-31's case: the short one's logits row must still fit), each equal to its
    run alone."""
    long_p = tiny_prompts(tiny, n=1, seed=3)[0] * 12
    short = tiny_prompts(tiny, n=1, seed=5)[0][:5]
    alone = tiny.generate(short, max_new_tokens=4, eos_token_id=[], prompt_cache=False)
    with Engine(tiny, max_batch=2, prefill_chunk=64) as eng:
        a = eng.submit(long_p, max_new_tokens=4, eos_token_id=[], prompt_logprobs=True)
        b = eng.submit(short, max_new_tokens=4, eos_token_id=[])
        eng.run_until_done()
    assert a.error is None and b.error is None
    assert len(a.prompt_logprobs) == len(long_p) and None not in a.prompt_logprobs[1:]
    assert b.tokens == list(alone)[len(short):]  # generate returns prompt + new tokens
