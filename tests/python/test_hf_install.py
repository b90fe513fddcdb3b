"""kwker.install(model): a transformers model's own generate() runs on Kwker.

The oracle is the same model's generate before install (transformers' float32 numbers on the
tiny random checkpoints of tiny_models.py, whose greedy tokens are well separated): greedy
outputs must be equal tensors, padding, eos and pad filling included. Also: which weights Kwker
runs (the model's files when they hold its parameters, else a saved copy, removed again),
sampling's shape and reproducibility under torch.manual_seed, streamers, return_dict_in_generate,
speculative decoding through an installed assistant, transformers' pipeline, and the fallback
to transformers' own generate for what Kwker does not do.
"""
import copy
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import tiny_models as tm

torch = pytest.importorskip("torch")
kwker = pytest.importorskip("kwker")

ARCHS = ["llama_tied", "llama3", "mistral_sw8", "qwen2", "qwen3", "gemma3", "llama_bf16",
         "qwen2_f16", "llama_sharded"]


def hf(model, *args, **kw):
    """transformers' own generate of an installed or plain model."""
    return type(model).generate(model, *args, **kw)


@pytest.fixture
def llama():
    m = tm.load_hf(tm.build("llama_tied"))
    yield m
    kwker.uninstall(m)


def left_padded(rows, pad=0):
    n = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (n - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (n - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


@pytest.mark.parametrize("name", ARCHS)
def test_greedy_equals_transformers(name):
    m = tm.load_hf(tm.build(name))
    ids = torch.tensor([tm.prompt_ids(name)])
    want = hf(m, ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    dec = kwker.install(m)
    try:
        # the checkpoint's files hold the float32 model's values (bf16 / f16 ones widened)
        assert m._kwker_install.saved_dir is None and m.kwker is dec
        got = m.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert got.dtype == torch.long and torch.equal(got, want)
        assert dec.stats["generated"] == 12  # Kwker ran it
    finally:
        assert kwker.uninstall(m)
    assert "generate" not in m.__dict__ and not hasattr(m, "kwker")
    assert not kwker.uninstall(m)


def test_batch_padding_eos_and_pad(llama):
    rows = [tm.prompt_ids("llama_tied", seed=s) for s in range(3)]
    rows[0] = rows[0][:7]
    ids, mask = left_padded(rows)
    plain = hf(llama, ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
               pad_token_id=0)
    # an eos the second row writes at its fourth new token: it stops there, padded after
    eos = int(plain[1, ids.shape[1] + 3])
    cases = [dict(max_new_tokens=10, pad_token_id=0), dict(max_new_tokens=10, eos_token_id=eos,
                                                             pad_token_id=5),
             dict(max_new_tokens=10, eos_token_id=[eos, 7], pad_token_id=5),
             dict(max_length=ids.shape[1] + 6, pad_token_id=0),
             dict(max_new_tokens=10, eos_token_id=eos, pad_token_id=5, min_new_tokens=6),
             dict(max_new_tokens=10, eos_token_id=eos, pad_token_id=5,
                  min_length=ids.shape[1] + 5)]
    wants = [hf(llama, ids, attention_mask=mask, do_sample=False, **kw) for kw in cases]
    kwker.install(llama)
    for kw, want in zip(cases, wants):
        got = llama.generate(ids, attention_mask=mask, do_sample=False, **kw)
        assert torch.equal(got, want), kw
    assert (wants[1][1, ids.shape[1] + 4:] == 5).all()  # the case did stop a row early


def test_lengths_and_configs(llama):
    from transformers import GenerationConfig
    ids = torch.tensor([tm.prompt_ids("llama_tied")])
    n = ids.shape[1]
    calls = [((ids,), dict(pad_token_id=0)),  # no length: transformers' max_length 20
             ((ids,), dict(max_length=n + 2, pad_token_id=0)),
             ((), dict(input_ids=ids, max_new_tokens=5, pad_token_id=0)),
             ((), dict(inputs=ids, generation_config=GenerationConfig(max_new_tokens=4,
                                                                      pad_token_id=0))),
             ((ids, GenerationConfig(max_new_tokens=3, pad_token_id=0)), {}),
             ((ids[0],), dict(max_new_tokens=3, pad_token_id=0))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wants = [hf(llama, *a, **kw) if a and a[0].dim() == 2 or not a else None
                 for a, kw in calls]
    kwker.install(llama)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these falls back
        for (a, kw), want in zip(calls, wants):
            got = llama.generate(*a, **kw)
            if want is None:  # a 1-D prompt is one row, as transformers' callers pass it
                want = hf(llama, a[0].unsqueeze(0), **kw)
            assert torch.equal(got, want), kw
    for gen in (llama.generate, lambda *a, **k: hf(llama, *a, **k)):  # no room: both refuse
        with pytest.raises(ValueError, match="max_length"):
            gen(ids, max_length=n - 3, pad_token_id=0)
    out = llama.generate(ids, max_new_tokens=4, pad_token_id=0, return_dict_in_generate=True)
    from transformers.generation.utils import GenerateDecoderOnlyOutput
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, hf(llama, ids, max_new_tokens=4, pad_token_id=0))


def test_weights_changed_in_memory_are_saved():
    m = tm.load_hf(tm.build("qwen2"))
    with torch.no_grad():
        m.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    ids = torch.tensor([tm.prompt_ids("qwen2")])
    want = hf(m, ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    kwker.install(m)
    saved = m._kwker_install.saved_dir
    assert saved and os.path.isdir(saved)  # the files no longer hold the model
    try:
        assert torch.equal(m.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0),
                           want)
    finally:
        kwker.uninstall(m)
    assert not os.path.exists(saved)


def test_model_from_config_and_other_dtype(tmp_path):
    import transformers
    path = tm.build("llama_odd")
    cfg = transformers.AutoConfig.from_pretrained(path)
    cfg._name_or_path = ""  # made from a config alone: no files to map
    fresh = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    fresh.load_state_dict(tm.load_hf(path).state_dict())
    assert not fresh.name_or_path
    ids = torch.tensor([tm.prompt_ids("llama_odd")])
    want = hf(fresh, ids, max_new_tokens=10, do_sample=False, pad_token_id=0)
    kwker.install(fresh, save_dir=tmp_path)
    assert os.path.dirname(fresh._kwker_install.saved_dir) == str(tmp_path)
    assert torch.equal(fresh.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=0),
                       want)
    kwker.uninstall(fresh)
    assert os.listdir(tmp_path) == []
    # a bfloat16 model of float32 files: Kwker runs the bf16 values (a saved copy), in float32,
    # as transformers runs the same values widened
    half = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    wide = copy.deepcopy(half).float()
    want = hf(wide, ids, max_new_tokens=10, do_sample=False, pad_token_id=0)
    kwker.install(half)
    try:
        assert half._kwker_install.saved_dir
        assert torch.equal(half.generate(ids, max_new_tokens=10, do_sample=False,
                                         pad_token_id=0), want)
    finally:
        kwker.uninstall(half)


def test_sampling(llama):
    rows = [tm.prompt_ids("llama_tied", seed=s) for s in range(2)]
    ids, mask = left_padded(rows)
    kwker.install(llama)
    kw = dict(attention_mask=mask, do_sample=True, temperature=1.5, top_k=0,
              num_return_sequences=3, max_new_tokens=12, pad_token_id=0)
    torch.manual_seed(7)
    a = llama.generate(ids, **kw)
    torch.manual_seed(7)
    b = llama.generate(ids, **kw)
    c = llama.generate(ids, **kw)
    assert a.shape == (6, ids.shape[1] + 12) and torch.equal(a, b) and not torch.equal(a, c)
    for r in range(6):  # each row its input, repeated per sequence, as transformers lays it out
        assert torch.equal(a[r, :ids.shape[1]], ids[r // 3])
    assert len({tuple(a[r].tolist()) for r in range(6)}) == 6  # the samples differ
    # one row alone samples through the decoder, reproducibly too
    torch.manual_seed(3)
    d = llama.generate(ids[1:], do_sample=True, max_new_tokens=12, pad_token_id=0)
    torch.manual_seed(3)
    assert torch.equal(d, llama.generate(ids[1:], do_sample=True, max_new_tokens=12,
                                         pad_token_id=0))


class Recorder:
    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        assert isinstance(value, torch.Tensor)
        self.puts.append((tuple(value.shape), value.tolist()))

    def end(self):
        self.ended += 1


def test_streamer(llama):
    ids = torch.tensor([tm.prompt_ids("llama_tied")])
    want = Recorder()
    hf(llama, ids, max_new_tokens=6, do_sample=False, pad_token_id=0, streamer=want)
    kwker.install(llama)
    got = Recorder()
    llama.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0, streamer=got)
    assert got.puts == want.puts and got.ended == want.ended == 1
    with pytest.raises(ValueError, match="streamer"):
        llama.generate(torch.cat([ids, ids]), max_new_tokens=2, streamer=Recorder())


def test_speculative(llama):
    """An installed assistant model drafts (Kwker's speculative decoding, exact), as does
    prompt lookup: the tokens are greedy decoding's."""
    ids = torch.tensor([tm.prompt_ids("llama_tied")])
    want = hf(llama, ids, max_new_tokens=16, do_sample=False, pad_token_id=0)
    draft = tm.load_hf(tm.build("llama_tied"))
    kwker.install(llama)
    kwker.install(draft)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = llama.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0,
                                 assistant_model=draft)
            assert torch.equal(got, want)
            assert llama.kwker.stats["accepted"] > 0  # the same model drafts: it agrees
            got = llama.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0,
                                 prompt_lookup_num_tokens=4)
            assert torch.equal(got, want)
    finally:
        kwker.uninstall(draft)


def test_fallback(llama):
    from transformers import LogitsProcessorList, TemperatureLogitsWarper
    ids = torch.tensor([tm.prompt_ids("llama_tied")])
    beams = hf(llama, ids, max_new_tokens=6, num_beams=2, do_sample=False, pad_token_id=0)
    kwker.install(llama)
    with pytest.warns(UserWarning, match="num_beams=2"):
        got = llama.generate(ids, max_new_tokens=6, num_beams=2, do_sample=False,
                             pad_token_id=0)
    assert torch.equal(got, beams)
    with pytest.warns(UserWarning, match="logits_processor"):
        llama.generate(ids, max_new_tokens=2, pad_token_id=0,
                       logits_processor=LogitsProcessorList([TemperatureLogitsWarper(0.5)]))
    with pytest.warns(UserWarning, match="output_scores"):
        out = llama.generate(ids, max_new_tokens=2, pad_token_id=0, output_scores=True,
                             return_dict_in_generate=True)
    assert out.scores is not None
    kwker.install(llama, fallback=False)
    with pytest.raises(NotImplementedError, match="num_beams=2"):
        llama.generate(ids, max_new_tokens=6, num_beams=2)
    with pytest.raises(ValueError, match="max_cache_len"):
        llama.generate(ids, max_new_tokens=10 ** 6)


def test_pipeline(tmp_path):
    """transformers' text-generation pipeline over an installed model (a tiny Llama on GPT-2's
    vocabulary, made in memory): the same text as the model's own generate."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from conftest import SHARED_DATA
    gpt2 = SHARED_DATA / "tokenizers" / "gpt2"
    t = Tokenizer(models.BPE.from_file(str(gpt2 / "encoder.json"), str(gpt2 / "vocab.bpe")))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<|endoftext|>",
                                               eos_token="<|endoftext|>")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=512,
                                   bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                   tie_word_embeddings=False)
    m = transformers.LlamaForCausalLM(cfg).eval()
    tm._randomize(m, {"tie": False})
    pipe = transformers.pipeline("text-generation", model=m, tokenizer=tok, device="cpu")
    prompts = ["The weather today is", "Once upon a time, in a land"]
    want = [pipe(p, max_new_tokens=12, do_sample=False)[0]["generated_text"] for p in prompts]
    kwker.install(m, save_dir=tmp_path)
    try:
        got = [pipe(p, max_new_tokens=12, do_sample=False)[0]["generated_text"] for p in prompts]
        assert got == want and m.kwker.stats["generated"] == 12
    finally:
        kwker.uninstall(m)


def test_import_needs_no_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; "
            "sys.path.insert(0, %r); import kwker, kwker.hf; "
            "assert kwker.install is kwker.hf.install and kwker.uninstall(object()) is False; "
            "print('ok')" % str(Path(kwker.__file__).parent.parent))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ))
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_refuses_what_it_cannot_run(llama):
    with pytest.raises(TypeError):
        kwker.install(object())
    with pytest.raises(kwker.KwkError, match="max_cache_len"):
        kwker.install(llama, max_cache_len=10 ** 9)
    assert getattr(llama, "_kwker_install", None) is None  # nothing was left half-installed


def test_real_model_batch():
    """The real SmolLM2-135M-Instruct (its Q4_1 GGUF, which transformers dequantizes to float32;
    the GGUF's folder holds no safetensors, so Kwker runs a saved copy of the model): a
    left-padded batch of two chats, greedy, equals transformers' generate token for token."""
    from test_decode_smollm2 import locate_smollm2
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = locate_smollm2()
    tm.torch_single_thread()
    d, f = str(path.parent), path.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    chats = [[{"role": "user", "content": "What is the capital of France?"}],
             [{"role": "system", "content": "You are a poet."},
              {"role": "user", "content": "Write two lines about the sea and the wind."}]]
    texts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
             for c in chats]
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert (batch["attention_mask"] == 0).any()  # the rows do differ in length
    with torch.no_grad():
        want = model.generate(**batch, max_new_tokens=24, do_sample=False)
    kwker.install(model)
    try:
        assert model._kwker_install.saved_dir
        got = model.generate(**batch, max_new_tokens=24, do_sample=False)
    finally:
        kwker.uninstall(model)
    assert torch.equal(got, want), (tok.batch_decode(got), tok.batch_decode(want))


def test_uninstall_during_a_call(llama):
    """Uninstalling from a streamer's callback (or another thread) while generate runs frees
    the decoder only when the call ends: the call finishes with transformers' tokens."""
    ids = torch.tensor([tm.prompt_ids("llama_tied")])
    want = hf(llama, ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    dec = kwker.install(llama)

    class Uninstaller(Recorder):
        def put(self, value):
            super().put(value)
            if len(self.puts) == 3:
                assert kwker.uninstall(llama)

    got = llama.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0,
                         streamer=Uninstaller())
    assert torch.equal(got, want)
    assert dec._dec is None  # freed once the call ended
    assert "generate" not in llama.__dict__  # transformers' own again
    assert torch.equal(llama.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0),
                       want)


def test_assistant_shared_between_threads(llama):
    """An installed model drafting for another while it generates itself in a second thread:
    its decoder is taken by one call at a time (this hung before it was locked)."""
    import threading
    ids = torch.tensor([tm.prompt_ids("llama_tied")])
    want = hf(llama, ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    draft = tm.load_hf(tm.build("llama_tied"))
    kwker.install(llama)
    kwker.install(draft)
    out, errors = {}, []

    def run(name, fn):
        try:
            for _ in range(3):
                out[name] = fn()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=("main", lambda: llama.generate(
                   ids, max_new_tokens=12, do_sample=False, pad_token_id=0,
                   assistant_model=draft))),
               threading.Thread(target=run, args=("draft", lambda: draft.generate(
                   ids, max_new_tokens=12, do_sample=False, pad_token_id=0)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert not any(t.is_alive() for t in threads) and not errors, errors
        assert torch.equal(out["main"], want) and torch.equal(out["draft"], want)
    finally:
        kwker.uninstall(draft)


def test_config_changed_at_load():
    """A config changed at load (from_pretrained(path, rms_norm_eps=...)) is the model's: the
    folder's config.json is not, so Kwker runs a saved copy."""
    import transformers
    path = tm.build("llama_tied")
    m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                          rms_norm_eps=0.5).eval()
    ids = torch.tensor([tm.prompt_ids("llama_tied")])
    want = hf(m, ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert not torch.equal(want, hf(tm.load_hf(path), ids, max_new_tokens=12, do_sample=False,
                                    pad_token_id=0))  # the change does change the tokens
    kwker.install(m)
    try:
        assert m._kwker_install.saved_dir
        assert torch.equal(m.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0),
                           want)
    finally:
        kwker.uninstall(m)


def test_freed_without_the_cycle_collector():
    import gc
    import weakref
    m = tm.load_hf(tm.build("llama_tied"))
    m.generate(torch.tensor([[1, 5, 9]]), max_new_tokens=2, pad_token_id=0)
    dec = kwker.install(m)
    alive = weakref.ref(m)
    gc.disable()
    try:
        del m
        assert alive() is None and dec._dec is None
    finally:
        gc.enable()


def test_streamer_prompt_padding_and_right_padding(llama):
    rows = [tm.prompt_ids("llama_tied")[:6], tm.prompt_ids("llama_tied", seed=1)]
    ids, mask = left_padded(rows)
    want = Recorder()
    hf(llama, ids[:1], attention_mask=mask[:1], max_new_tokens=4, do_sample=False,
       pad_token_id=0, streamer=want)
    kwker.install(llama)
    got = Recorder()
    llama.generate(ids[:1], attention_mask=mask[:1], max_new_tokens=4, do_sample=False,
                   pad_token_id=0, streamer=got)
    assert got.puts == want.puts and got.puts[0][1][0][0] == 0  # the prompt as given, padded
    with pytest.warns(UserWarning, match="max_time"):
        llama.generate(ids[1:], max_new_tokens=4, pad_token_id=0, max_time=100.0)
    right = torch.tensor([rows[0] + [0] * (len(rows[1]) - 6), rows[1]])
    rmask = torch.tensor([[1] * 6 + [0] * (len(rows[1]) - 6), [1] * len(rows[1])])
    with pytest.warns(UserWarning, match="right-padding"):
        llama.generate(right, attention_mask=rmask, max_new_tokens=4, pad_token_id=0)
