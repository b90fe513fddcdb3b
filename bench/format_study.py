#!/usr/bin/env python3
"""format_study.py - perplexity of candidate quantized weight formats, simulated in float
(quantize, then dequantize) with torch + transformers, to choose Kwker's weight format.

  python3 bench/format_study.py [--chunks 20] [--configs NAME,NAME,..] [--list] [-t 2]
                                [--model GGUF] [--text FILE] [--bos auto|always|never]
                                [--score llama|half] [--check-tokens]

What it measures: for each configuration "WEIGHTS/ACTS" (e.g. q4a-128-opt/act32), every
nn.Linear of the decoder layers gets the weight format WEIGHTS, the output head (untied from the
token embedding, which stays float) gets q8s-32 in 4-bit configurations and the configuration's
own format in 8-bit ones, and with ACTS = actG the input of every quantized linear (the head
too) is rounded to int8 per token per G columns (scale amax/127). Weight formats, groups along
the input columns of each row:
  q4a-G[-opt]  asymmetric 4-bit, d = (max-min)/15 and m = min as fp16: 4 + 32/G bits
  q4s-32[-opt] symmetric 4-bit, llama.cpp's Q4_0 (d = signed max / -8, fp16): 4 + 16/G bits
  q8s-G        symmetric 8-bit, d = amax/127 (fp16; G = row: one float32 scale a row)
  -opt         20 trial clips, t = 1.0 .. 0.8 (range / scale times t), least squared error
               per group.
The table: bits per weight and relative RMS weight error sqrt(sum (w'-w)^2 / sum w^2) over all
layer matrices (not the head), PPL +/- SE, and the change against the float model.

Perplexity, llama-perplexity's protocol as bench/ppl.py and `kwker perplexity` run it: the
text's bytes as UTF-8 (CRLF kept; one trailing "\\n" dropped), tokenized whole without special
tokens, cut into chunks of 512; each chunk from an empty cache, its first token replaced by BOS
only when the vocabulary adds BOS (SmolLM2's GGUF does not: --bos auto); scored on logits rows
256..510 predicting tokens 257..511 (255 a chunk, --score llama; --score half scores 256, rows
255..510; --bos always --score half is the protocol as first specified for this study, 27.806
for float). PPL = exp(mean nll), SE = PPL * sqrt(var(nll) / (n - 1)). This reproduces the F32
original's 27.8422 of docs/benchmarks.md. The tokenizer transformers builds from the GGUF lacks
SmolLM's digit splitting (llama.cpp's "smollm" pre-tokenizer splits every digit first); it is
patched here, which gives llama.cpp's ids exactly (--check-tokens compares them when
llama_cpp is importable).

CAVEAT: the "float" model is the Q4_1 GGUF dequantized, i.e. the layer weights are already
asymmetric 4-bit with groups of 32 (fp16 d, m per 32), and the token embedding / head is Q8_0.
So q4a-32 reproduces the layer weights exactly (RMS error 0: every Q4_1 block spans q = 0..15,
so min, max and the fp16 d, m come back bit for bit) and q8s-32 reproduces the head; every other 4-bit format is a lossy re-quantization of already
4-bit weights. Groups that do not divide a row (128 in SmolLM2-135M's 576 columns) end in a
shorter tail group (4 x 128 + 64), counted in the bits per weight (q4a-128: 4.271, not 4.25).
Compare q4a-64 / q4a-128 with q4s-32 (llama.cpp's Q4_0, equally a re-quantization; it
reproduces llama.cpp's own Q4_0 PPL), not with q4a-32, whose zero loss is an artefact of the
source; the re-quantizations' absolute losses are larger than the same formats would lose on
the model's original bf16 weights.
"""
import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ppl  # noqa: E402  (read_text, DEFAULT_TEXT: the text as llama-perplexity reads it)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
LAYER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
N_TRIALS = 20

CONFIGS = [
    "float",
    "float/act32", "float/act128",
    "q8s-32/act32", "q8s-128/act32", "q8s-row/act32", "q8s-128/act128",
    "q4a-32/act32", "q4a-32-opt/act32", "q4s-32/act32", "q4s-32-opt/act32",
    "q4a-64/act32", "q4a-64-opt/act32", "q4a-128/act32", "q4a-128-opt/act32",
    "q4a-128-opt/act128",
    "q4a-32/none", "q4s-32/none", "q4s-32-opt/none", "q4a-64-opt/none", "q4a-128-opt/none",
    "q8s-32/none", "q8s-128/none", "q8s-row/none",
]


# ---------------------------------------------------------------------------------------------
# weight formats (fake quantization: returns the dequantized matrix)

def fp16(x):
    return x.half().float()


def parse_format(name):
    """'q4a-128-opt' -> (kind 'q4a', group 128 or 'row', opt True)."""
    parts = name.split("-")
    kind, group, opt = parts[0], parts[1], parts[2:] == ["opt"]
    if kind not in ("q4a", "q4s", "q8s") or parts[2:] not in ([], ["opt"]):
        raise SystemExit("unknown weight format %r" % name)
    if group != "row":
        group = int(group)
    if kind == "q4s" and group != 32 or kind == "q8s" and opt:
        raise SystemExit("weight format %r not in this study" % name)
    return kind, group, opt


def bits_per_weight(name, shapes):
    """Bits per weight over matrices of the given (rows, cols) shapes."""
    kind, group, _ = parse_format(name)
    bits = {"q4a": 4, "q4s": 4, "q8s": 8}[kind]
    scale_bits = {"q4a": 32, "q4s": 16, "q8s": 16}[kind]
    total = sum(r * c for r, c in shapes)
    if group == "row":  # one float32 scale a row
        return bits + 32.0 * sum(r for r, _ in shapes) / total
    # groups a row: ceil(cols / group) (a shorter tail group where group does not divide cols)
    return bits + scale_bits * sum(r * -(-c // group) for r, c in shapes) / total


def trial_factors():
    return torch.linspace(1.0, 0.8, N_TRIALS).tolist()


def best_of_trials(w, opt, quant):
    """quant(t) -> dequantized w for trial factor t; opt: the least squared error per group
    (row of w) over the trials, else the plain choice t = 1.0."""
    if not opt:
        return quant(1.0)
    best, best_err = None, None
    for t in trial_factors():
        wq = quant(t)
        err = ((wq - w) ** 2).sum(dim=1, keepdim=True)
        if best is None:
            best, best_err = wq, err
        else:
            better = err < best_err
            best = torch.where(better, wq, best)
            best_err = torch.where(better, err, best_err)
    return best


def q4a_groups(w, opt):
    """w [n, G]: asymmetric 4-bit; opt: shrink [min, max] about its midpoint by t."""
    lo = w.amin(dim=1, keepdim=True)
    hi = w.amax(dim=1, keepdim=True)
    mid, half = (lo + hi) * 0.5, (hi - lo) * 0.5

    def quant(t):
        lo_t, hi_t = (lo, hi) if t == 1.0 else (mid - half * t, mid + half * t)
        d = fp16((hi_t - lo_t) / 15)
        m = fp16(lo_t)
        inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
        return d * torch.clamp(torch.round((w - m) * inv), 0, 15) + m
    return best_of_trials(w, opt, quant)


def q4s_groups(w, opt):
    """w [n, G]: llama.cpp Q4_0: d = (value of largest magnitude) / -8; opt: d times t."""
    a = w.gather(1, w.abs().argmax(dim=1, keepdim=True))

    def quant(t):
        d = fp16(a / -8 * t)
        inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
        return d * (torch.clamp(torch.round(w * inv) + 8, 0, 15) - 8)
    return best_of_trials(w, opt, quant)


def q8s_groups(w, half_scale):
    amax = w.abs().amax(dim=1, keepdim=True)
    d = amax / 127
    if half_scale:
        d = fp16(d)
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    return d * torch.clamp(torch.round(w * inv), -127, 127)


def split_groups(cols, group):
    """Column ranges of the groups of a row: full groups of `group`, then a shorter tail group
    when cols is not a multiple (576 = 4 x 128 + 64 in SmolLM2-135M)."""
    full = cols // group * group
    return [(0, full, group)] * (full > 0) + [(full, cols, cols - full)] * (cols > full)


def fake_quant(w, name):
    """Quantize and dequantize matrix w [rows, cols] in format name (groups along cols)."""
    kind, group, opt = parse_format(name)
    rows, cols = w.shape
    w = w.detach().float()
    out = torch.empty_like(w)
    for a, b, g in split_groups(cols, cols if group == "row" else group):
        flat = w[:, a:b].reshape(-1, g)
        if kind == "q4a":
            q = q4a_groups(flat, opt)
        elif kind == "q4s":
            q = q4s_groups(flat, opt)
        else:
            q = q8s_groups(flat, half_scale=group != "row")
        out[:, a:b] = q.reshape(rows, b - a)
    return out


# ---------------------------------------------------------------------------------------------
# activation fake quantization

def act8(x, group):
    """x [..., cols] rounded to int8 per token per group of columns (a shorter tail group when
    cols is not a multiple), scale amax / 127; an all-zero group stays 0."""
    shape = x.shape
    cols = shape[-1]
    x2 = x.reshape(-1, cols)
    out = torch.empty_like(x2)
    for a, b, g in split_groups(cols, group):
        xg = x2[:, a:b].reshape(x2.shape[0], (b - a) // g, g)
        # amax 0 means every x of the group is 0, which any finite scale maps to 0
        amax = xg.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
        out[:, a:b] = (torch.round(xg * (127.0 / amax)) * (amax / 127.0)).reshape(-1, b - a)
    return out.reshape(shape)


def act8_hook(group, memo):
    """Forward pre-hook; memo holds the last input and its rounding: q, k, v (and gate, up)
    are called with the same tensor, which is then rounded once."""
    def hook(module, args):
        x = args[0]
        if memo.get("x") is not x:
            memo["x"], memo["xq"] = x, act8(x, group)
        return (memo["xq"],) + tuple(args[1:])
    return hook


# ---------------------------------------------------------------------------------------------
# model, text, perplexity

def gguf_field(path, key):
    from gguf import GGUFReader
    f = GGUFReader(str(path)).fields.get(key)
    return None if f is None else f.contents()


def load(model_path, log):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    d, n = str(model_path.parent), model_path.name
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=n)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=n, dtype=torch.float32).eval()
    log("loaded %s in %.1f s" % (n, time.time() - t0))
    pre = gguf_field(model_path, "tokenizer.ggml.pre")
    if pre == "smollm":
        # llama.cpp's smollm pre-tokenizer: \p{N} split one digit at a time, then GPT-2's regex
        # (SmolLM's tokenizer.json: Digits(individual) + ByteLevel); transformers' GGUF
        # conversion keeps only the ByteLevel part.
        from tokenizers import pre_tokenizers as pt
        tok.backend_tokenizer.pre_tokenizer = pt.Sequence([
            pt.Digits(individual_digits=True),
            pt.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        log("warning: pre-tokenizer %r kept as transformers converts it" % pre)
    add_bos = bool(gguf_field(model_path, "tokenizer.ggml.add_bos_token"))
    return model, tok, add_bos


def check_tokens(model_path, text_bytes_path, ids, log):
    try:
        from llama_cpp import Llama
    except ImportError as e:
        log("token check skipped: %s" % e)
        return
    llm = Llama(str(model_path), vocab_only=True, verbose=False)
    ref = llm.tokenize(ppl.read_text(text_bytes_path), add_bos=False, special=False)
    same = list(ref) == list(ids)
    log("token check against llama.cpp: %s (%d vs %d tokens)" % (
        "identical" if same else "DIFFERENT", len(ids), len(ref)))


def perplexity(model, ids, n_chunks, ctx, bos_id, score, log):
    first = ctx // 2 if score == "llama" else ctx // 2 - 1  # first logits row scored
    nlls = []
    t0 = time.time()
    with torch.inference_mode():
        for c in range(n_chunks):
            chunk = ids[c * ctx:(c + 1) * ctx].clone()
            if bos_id is not None:
                chunk[0] = bos_id
            hidden = model.model(input_ids=chunk[None]).last_hidden_state[0]
            logits = model.lm_head(hidden[first:ctx - 1]).double()
            lp = torch.log_softmax(logits, dim=-1)
            nlls.append(-lp.gather(1, chunk[first + 1:, None])[:, 0])
    nll = torch.cat(nlls)
    mean = nll.mean().item()
    var = (nll * nll).mean().item() - mean * mean
    ppl = math.exp(mean)
    se = ppl * math.sqrt(var / (len(nll) - 1)) if var > 0 else float("nan")
    return dict(ppl=ppl, se=se, count=len(nll), seconds=time.time() - t0)


# ---------------------------------------------------------------------------------------------

class Study:
    def __init__(self, model):
        self.model = model
        self.linears = []  # (name, module) of the decoder layers' linears
        for name, mod in model.model.layers.named_modules():
            if isinstance(mod, torch.nn.Linear) and name.rsplit(".", 1)[-1] in LAYER_LINEARS:
                self.linears.append((name, mod))
        self.orig = {name: mod.weight.detach().clone() for name, mod in self.linears}
        self.embed = model.model.embed_tokens.weight.detach().clone()
        # untie: the head gets its own parameter, the embedding lookup keeps the float table
        model.lm_head.weight = torch.nn.Parameter(self.embed.clone(), requires_grad=False)
        model.config.tie_word_embeddings = False
        self.shapes = [tuple(w.shape) for w in self.orig.values()]
        self.hooks = []
        self.cache = {}  # weight format -> (rms error of layers, rms error of head)

    def set_weights(self, fmt):
        """Layers in fmt (None: float); head in q8s-32 for 4-bit formats, fmt for 8-bit ones."""
        head_fmt = None if fmt is None else ("q8s-32" if fmt.startswith("q4") else fmt)
        def sq(x):
            return (x * x).sum(dtype=torch.float64).item()
        num = den = 0.0
        with torch.no_grad():
            for name, mod in self.linears:
                w = self.orig[name]
                wq = w if fmt is None else fake_quant(w, fmt)
                if fmt is not None:
                    num += sq(wq - w)
                    den += sq(w)
                mod.weight.copy_(wq)
            hq = self.embed if head_fmt is None else fake_quant(self.embed, head_fmt)
            head_err = 0.0 if head_fmt is None else math.sqrt(sq(hq - self.embed) / sq(self.embed))
            self.model.lm_head.weight.copy_(hq)
        assert self.model.model.embed_tokens.weight.data_ptr() != \
            self.model.lm_head.weight.data_ptr()
        return (math.sqrt(num / den) if den else 0.0), head_fmt, head_err

    def set_acts(self, group):
        for h in self.hooks:
            h.remove()
        self.hooks = []
        if group is None:
            return
        memo = {}
        for _, mod in self.linears + [("lm_head", self.model.lm_head)]:
            self.hooks.append(mod.register_forward_pre_hook(act8_hook(group, memo)))


def parse_config(cfg):
    """'q4a-128-opt/act32' -> ('q4a-128-opt', 32); 'float' -> (None, None)."""
    w, _, a = cfg.partition("/")
    fmt = None if w == "float" else w
    if fmt is not None:
        parse_format(fmt)
    if a in ("", "none"):
        act = None
    elif a.startswith("act") and a[3:].isdigit():
        act = int(a[3:])
    else:
        raise SystemExit("unknown activation setting %r in %r" % (a, cfg))
    return fmt, act


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="comma-separated WEIGHTS/ACTS names (--list shows the study's)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--text", type=Path, default=ppl.DEFAULT_TEXT)
    ap.add_argument("--bos", choices=("auto", "always", "never"), default="auto",
                    help="replace each chunk's first token by BOS: auto = when the vocabulary "
                         "adds BOS (llama.cpp)")
    ap.add_argument("--score", choices=("llama", "half"), default="llama",
                    help="llama: rows ctx/2..ctx-2 (ctx/2-1 tokens a chunk); half: rows "
                         "ctx/2-1..ctx-2 (ctx/2 tokens)")
    ap.add_argument("--check-tokens", action="store_true",
                    help="compare the ids with llama.cpp's (llama_cpp, vocab only)")
    args = ap.parse_args()
    if args.list:
        print("\n".join(CONFIGS))
        return
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if "float" not in configs:  # the baseline every "vs float" is taken against
        configs.insert(0, "float")
    parsed = [parse_config(c) for c in configs]

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    torch.set_num_threads(args.threads)
    t_start = time.time()
    model, tok, add_bos = load(args.model, log)
    text = ppl.read_text(args.text).decode("utf-8")  # CRLF kept
    ids = tok(text, add_special_tokens=False)["input_ids"]
    log("%d tokens (%d CRLF in the text)" % (len(ids), text.count("\r\n")))
    if args.check_tokens:
        check_tokens(args.model, args.text, ids, log)
    ids = torch.tensor(ids, dtype=torch.long)
    n_chunks = min(args.chunks, len(ids) // args.ctx)
    use_bos = args.bos == "always" or (args.bos == "auto" and add_bos)
    bos_id = tok.bos_token_id if use_bos else None
    log("%d chunks of %d, BOS %s, scoring %s" % (
        n_chunks, args.ctx, "in front" if use_bos else "not added", args.score))

    study = Study(model)
    rows, base = [], None
    for cfg, (fmt, act) in zip(configs, parsed):
        t0 = time.time()
        w_err, head_fmt, head_err = study.set_weights(fmt)
        study.set_acts(act)
        tq = time.time() - t0
        r = perplexity(model, ids, n_chunks, args.ctx, bos_id, args.score, log)
        if cfg == "float":
            base = r["ppl"]
        row = dict(cfg=cfg, fmt=fmt, bpw=None if fmt is None else bits_per_weight(fmt, study.shapes),
                   w_err=None if fmt is None else w_err, head_fmt=head_fmt, head_err=head_err, **r)
        rows.append(row)
        log("%-20s PPL %.4f +/- %.4f  (weights %.1f s, eval %.1f s)" % (
            cfg, r["ppl"], r["se"], tq, r["seconds"]))
    study.set_acts(None)

    print()
    def fmt_err(e):
        return "0" if e == 0 else ("%.4f" % e if e >= 1e-3 else "%.1e" % e)

    print("| config | bits/weight | weight RMS err | head | PPL +/- SE | vs float |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        bpw = "32" if r["bpw"] is None else "%.3f" % r["bpw"]
        werr = "0" if r["w_err"] is None else fmt_err(r["w_err"])
        head = "float" if r["head_fmt"] is None else "%s (%s)" % (r["head_fmt"], fmt_err(r["head_err"]))
        vs = "%+.3f%%" % (100 * (r["ppl"] / base - 1))
        print("| %s | %s | %s | %s | %.4f +/- %.4f | %s |" % (
            r["cfg"], bpw, werr, head, r["ppl"], r["se"], vs))
    print()
    print("%d chunks of %d tokens, %d scored tokens a run; bits/weight and weight RMS error over "
          "the layer matrices (%d weights); head: its format (its RMS error); total %.0f s" % (
              n_chunks, args.ctx, rows[0]["count"] if rows else 0,
              sum(r * c for r, c in study.shapes), time.time() - t_start))


if __name__ == "__main__":
    main()
