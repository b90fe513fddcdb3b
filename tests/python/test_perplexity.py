"""`kwker perplexity` (llama.cpp's protocol) against a numpy recomputation from KwkDecoder.forward.

The model is the real SmolLM2-135M-Instruct Q4_1 GGUF (found as test_decode_smollm2 finds it),
the text the start of the wikitext-2 test split in ../shared/data/text. With --chunks 2 --ctx 128
the tool tokenizes the file (one trailing newline dropped, no special tokens, BOS in front only
when the vocabulary adds one), evaluates each chunk of 128 tokens from an empty cache (first token
replaced by BOS when the vocabulary adds one) and scores positions 64..126 predicting the next
token. The same computation is done here in float64 numpy from the decoder's logits; the printed
PPL and its standard error must agree to 1e-4 relative. Bad arguments must give exit code 2 with
a message. The binary is $KWKER_BIN, else <repo>/build/kwker: a missing binary FAILS the tests.
"""
import re
import subprocess

import numpy as np
import pytest

from conftest import REPO, SHARED_DATA, cli_env, kwker_bin

WIKITEXT = SHARED_DATA / "text" / "wikitext-2-raw-v1.test.hf-rows-crlf.txt"
CTX = 128
CHUNKS = 2


def run_ppl(*args, timeout=600):
    return subprocess.run([str(kwker_bin()), "perplexity", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=cli_env())


@pytest.fixture(scope="module")
def smol():
    from test_decode_smollm2 import locate_smollm2
    return locate_smollm2()


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """About 24 KB of wikitext (whole lines, CRLF kept, final newline kept: the tool drops it)."""
    assert WIKITEXT.is_file(), "missing test data %s" % WIKITEXT
    data = WIKITEXT.read_bytes()
    cut = data.index(b"\n", 24000) + 1
    path = tmp_path_factory.mktemp("ppl") / "wiki-head.txt"
    path.write_bytes(data[:cut])
    return path


def parse_output(out):
    running = [float(v) for v in re.findall(r"\[\d+\]([0-9.]+),", out)]
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
    assert m, "no final estimate in output:\n%s" % out
    m2 = re.search(r"nll_mean = ([-0-9.]+), ppl = ([0-9.eE+-]+), scored tokens = (\d+)", out)
    assert m2, "no nll_mean line in output:\n%s" % out
    return dict(running=running, ppl=float(m.group(1)), se=float(m.group(2)),
                nll_mean=float(m2.group(1)), ppl_full=float(m2.group(2)),
                count=int(m2.group(3)))


def numpy_perplexity(model, text_path, ctx, n_chunks):
    """llama.cpp's perplexity protocol over Kwker's own tokenizer and logits."""
    from kwker import KwkDecoder, Tokenizer
    tok = Tokenizer.from_pretrained(str(model))
    text = text_path.read_bytes()
    if text.endswith(b"\n"):
        text = text[:-1]
    ids = tok.encode(text.decode("utf-8"), add_special_tokens=False)
    bos = tok.bos_token_id
    probe_with = tok.encode("a", add_special_tokens=True)
    probe_without = tok.encode("a", add_special_tokens=False)
    add_bos = bos is not None and len(probe_with) > len(probe_without) and probe_with[0] == bos
    if add_bos:
        ids = [bos] + list(ids)
    ids = np.asarray(ids, dtype=np.int64)
    n_chunks = min(n_chunks, len(ids) // ctx)
    assert n_chunks >= 1
    nlls, running = [], []
    dec = KwkDecoder(str(model), max_cache_len=ctx)
    try:
        for c in range(n_chunks):
            chunk = ids[c * ctx:(c + 1) * ctx].copy()
            if add_bos:
                chunk[0] = bos
            logits = dec.forward(chunk.astype(np.int32)).astype(np.float64)
            rows = logits[ctx // 2:ctx - 1]
            target = ids[c * ctx + ctx // 2 + 1:(c + 1) * ctx]
            mx = rows.max(axis=1, keepdims=True)
            lse = np.log(np.exp(rows - mx).sum(axis=1)) + mx[:, 0]
            nlls.extend(lse - rows[np.arange(len(target)), target])
            running.append(float(np.exp(np.mean(nlls))))
    finally:
        dec.close()
    nll = np.asarray(nlls)
    mean = nll.mean()
    var = (nll * nll).mean() - mean * mean
    ppl = float(np.exp(mean))
    return dict(ppl=ppl, se=float(np.sqrt(var / (len(nll) - 1)) * ppl), nll_mean=float(mean),
                count=len(nll), running=running)


def test_binary_present():
    kwker_bin()


def test_perplexity_matches_numpy(smol, text_file):
    proc = run_ppl("--model", smol, "--file", text_file, "--chunks", CHUNKS, "--ctx", CTX,
                   "-t", 2)
    assert proc.returncode == 0, "exit %d\nstdout:\n%s\nstderr:\n%s" % (
        proc.returncode, proc.stdout, proc.stderr)
    got = parse_output(proc.stdout)
    ref = numpy_perplexity(smol, text_file, CTX, CHUNKS)
    assert got["count"] == ref["count"] == CHUNKS * (CTX - CTX // 2 - 1)
    assert len(got["running"]) == CHUNKS
    for a, b in zip(got["running"], ref["running"]):
        assert abs(a - b) <= 1e-4 * b + 5e-5, (got["running"], ref["running"])
    assert abs(got["ppl_full"] - ref["ppl"]) <= 1e-4 * ref["ppl"], (got, ref)
    assert abs(got["ppl"] - ref["ppl"]) <= 1e-4 * ref["ppl"] + 5e-5, (got, ref)
    assert abs(got["se"] - ref["se"]) <= 1e-4 * ref["se"] + 5e-6, (got, ref)
    # A real model on real text: far below a uniform guess over the vocabulary.
    assert 1.0 < ref["ppl"] < 200.0, ref


@pytest.fixture(scope="module")
def bos_model(tmp_path_factory):
    """A tiny random Llama with the Llama 2 tokenizer, whose vocabulary adds BOS."""
    import shutil
    import torch
    import transformers
    out = tmp_path_factory.mktemp("bos-model")
    tok_dir = SHARED_DATA / "tokenizers" / "llama2-tinyllama"
    shutil.copy(tok_dir / "tokenizer.json", out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(
        '{"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": true}')
    torch.manual_seed(5)
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, max_position_embeddings=256,
                                   bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def test_perplexity_bos_vocab(bos_model, text_file):
    """A vocabulary that adds BOS: BOS heads the stream and replaces each chunk's first token."""
    from kwker import Tokenizer
    tok = Tokenizer.from_pretrained(str(bos_model))
    assert tok.encode("a", add_special_tokens=True)[0] == tok.bos_token_id == 1
    proc = run_ppl("--model", bos_model, "--file", text_file, "--chunks", 3, "--ctx", 64,
                   "-t", 1)
    assert proc.returncode == 0, proc.stderr
    assert "BOS added" in proc.stderr, proc.stderr
    got = parse_output(proc.stdout)
    ref = numpy_perplexity(bos_model, text_file, 64, 3)
    assert got["count"] == ref["count"] == 3 * 31
    assert abs(got["ppl_full"] - ref["ppl"]) <= 1e-4 * ref["ppl"], (got, ref)
    assert abs(got["se"] - ref["se"]) <= 1e-4 * ref["se"] + 5e-6, (got, ref)


def test_chunks_capped_by_text(smol, tmp_path):
    """More chunks than the text holds: every whole chunk is scored, no error."""
    data = WIKITEXT.read_bytes()
    small = tmp_path / "small.txt"
    small.write_bytes(data[:data.index(b"\n", 2500) + 1])
    proc = run_ppl("--model", smol, "--file", small, "--chunks", 100000, "--ctx", 64)
    assert proc.returncode == 0, proc.stderr
    got = parse_output(proc.stdout)
    per_chunk = 64 - 32 - 1
    assert got["count"] % per_chunk == 0 and got["count"] >= 3 * per_chunk, got
    assert len(got["running"]) == got["count"] // per_chunk
    assert "(of %d in the file)" % len(got["running"]) in proc.stderr, proc.stderr


def test_text_too_short(smol, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Only a few words here.\n")
    proc = run_ppl("--model", smol, "--file", short, "--ctx", 128)
    assert proc.returncode == 1
    assert "at least 256" in proc.stderr, proc.stderr


def test_missing_file(smol, tmp_path):
    missing = tmp_path / "no-such-file.txt"
    proc = run_ppl("--model", smol, "--file", missing)
    assert proc.returncode == 1
    assert str(missing) in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, message", [
    ([], "--model and --file are required"),
    (["--model", "m.gguf"], "--model and --file are required"),
    (["--file", "t.txt"], "--model and --file are required"),
    (["--model", "m.gguf", "--file", "t.txt", "--ctx", "2"], "bad value '2' for --ctx"),
    (["--model", "m.gguf", "--file", "t.txt", "--ctx", "x"], "bad value 'x' for --ctx"),
    (["--model", "m.gguf", "--file", "t.txt", "--chunks", "-1"], "bad value '-1' for --chunks"),
    (["--model", "m.gguf", "--file", "t.txt", "--precision", "fp3"],
     "bad value 'fp3' for --precision"),
    (["--model", "m.gguf", "--file", "t.txt", "-t", "0"], "bad value '0' for -t"),
    (["--model", "m.gguf", "--file", "t.txt", "--bogus", "1"], "unknown option '--bogus'"),
    (["--model", "m.gguf", "--file"], "--file needs a value"),
])
def test_bad_arguments(args, message):
    proc = run_ppl(*args)
    assert proc.returncode == 2, (args, proc.returncode, proc.stderr)
    assert message in proc.stderr, proc.stderr
    assert "usage: kwker perplexity" in proc.stderr


def test_help():
    proc = run_ppl("--help")
    assert proc.returncode == 0
    assert "usage: kwker perplexity" in proc.stdout
