"""The kwker CLI's generate and chat commands, run as a person would run them, on the real
SmolLM2-135M-Instruct GGUF.

The binary is $KWKER_BIN or <repo>/build/kwker (a missing binary fails the tests). The reference
for every text is the Python binding (KwkDecoder.generate on the ids built with kwker.Tokenizer
and the model's chat template), itself tested by test_generate.py; when KWKER_LIB is not set the
library beside the binary is used so that both sides run the same build.
"""
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("KWKER_BIN") or REPO / "build" / "kwker")
if "KWKER_LIB" not in os.environ and (BIN.parent / "libkwker.so").exists():
    os.environ["KWKER_LIB"] = str(BIN.parent / "libkwker.so")

import kwker  # noqa: E402  (after KWKER_LIB is settled)
from kwker.template import apply_chat_template  # noqa: E402
from conftest import (cli_env, cpu_flags, cpu_has_amx, cpu_has_amx_bf16, kwker_bin, smollm2_gguf,
                      supported_isas)

N_NEW = 24
THREADS = "2"


def run(*args, input=None, timeout=300):
    return subprocess.run([kwker_bin()] + [str(a) for a in args], input=input,
                          capture_output=True, text=True, timeout=timeout, env=cli_env())


@pytest.fixture(scope="module")
def ref():
    """(decoder, tokenizer) of the Python binding on the same model."""
    dec = kwker.KwkDecoder(smollm2_gguf(), max_cache_len=2048, n_threads=2)
    tok = kwker.Tokenizer.from_pretrained(smollm2_gguf())
    yield dec, tok
    dec.close()


def chat_ids(tok, messages):
    text = apply_chat_template(tok.chat_template, messages, add_generation_prompt=True,
                               bos_token=tok.bos_token, eos_token=tok.eos_token)
    return tok.encode(text, add_special_tokens=False)


def ref_text(ref, ids, **kw):
    dec, tok = ref
    kw.setdefault("max_new_tokens", N_NEW)
    dec.generate(ids, tokenizer=tok, prompt_cache=False, **kw)
    return dec.stats["text"]


def gen(*args, **kw):
    p = run("generate", "--model", smollm2_gguf(), "-t", THREADS, *args, **kw)
    assert p.returncode == 0, "kwker generate %s failed (%d): %s" % (args, p.returncode,
                                                                     p.stderr)
    assert p.stdout.endswith("\n"), repr(p.stdout)
    return p


MESSAGES = ["What is the capital of France?", "Write a haiku about the sea.",
            "List three fruits."]


@pytest.mark.parametrize("msg", MESSAGES)
def test_generate_chat_equals_python(ref, msg):
    ids = chat_ids(ref[1], [{"role": "user", "content": msg}])
    want = ref_text(ref, ids)
    p = gen("--chat", msg, "-n", N_NEW)
    assert p.stdout == want + "\n"
    assert p.stderr == ""


def test_generate_chat_with_system_and_stats(ref):
    msgs = [{"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": "Name a large animal."}]
    ids = chat_ids(ref[1], msgs)
    want = ref_text(ref, ids)
    p = gen("--system", msgs[0]["content"], "--chat", msgs[1]["content"], "-n", N_NEW,
            "--stats")
    assert p.stdout == want + "\n"
    m = re.search(r"prompt (\d+) tokens, reused (\d+).*generated (\d+) tokens.*finish (\w+)",
                  p.stderr)
    assert m, p.stderr
    assert int(m.group(1)) == len(ids) and int(m.group(2)) == 0
    assert m.group(4) in ("stop", "length")


def test_generate_prompt_equals_python(ref):
    dec, tok = ref
    text = "The three primary colors are"
    want = ref_text(ref, tok.encode(text, add_special_tokens=True))
    assert gen("--prompt", text, "-n", N_NEW).stdout == want + "\n"


def test_generate_ids_keeps_its_format(ref):
    dec, tok = ref
    ids = chat_ids(tok, [{"role": "user", "content": "Hello!"}])
    want = dec.generate_greedy(ids, max_new_tokens=12)[len(ids):]
    p = gen("--ids", ",".join(map(str, ids)), "-n", 12)
    assert p.stdout == ",".join(map(str, want)) + "\n"
    # no --n: 16 new tokens at most, as before
    p = gen("--ids", ",".join(map(str, ids)), "--lookup", "0")
    assert 1 <= len(p.stdout.strip().split(",")) <= 16


def test_stop_cuts_the_reply(ref):
    msg = "Write a haiku about the sea."
    ids = chat_ids(ref[1], [{"role": "user", "content": msg}])
    full = ref_text(ref, ids)
    words = full.split()
    assert len(words) >= 4, full
    stop = words[len(words) // 2]
    want = full[:full.index(stop)]
    p = gen("--chat", msg, "-n", N_NEW, "--stop", "no such text", "--stop", stop, "--stats")
    assert p.stdout == want + "\n"
    assert stop not in p.stdout
    assert "finish stop" in p.stderr
    assert ref_text(ref, ids, stop=["no such text", stop]) == want


def test_seed_reproducible_and_equal_to_python(ref):
    msg = "Tell me a story about a cat."
    args = ("--chat", msg, "-n", N_NEW, "--temperature", "0.9", "--seed", "1234")
    a = gen(*args).stdout
    b = gen(*args, "--lookup", "0").stdout
    assert a == b, "same seed, different text (lookup on vs off)"
    ids = chat_ids(ref[1], [{"role": "user", "content": msg}])
    # the CLI samples with llama-cli's defaults top-k 40, top-p 0.95, min-p 0.05
    want = ref_text(ref, ids, do_sample=True, temperature=0.9, top_k=40, top_p=0.95,
                    min_p=0.05, seed=1234)
    assert a == want + "\n"
    others = {gen("--chat", msg, "-n", N_NEW, "--temperature", "0.9", "--seed", s).stdout
              for s in ("1", "2", "3")}
    assert len(others | {a}) > 1, "every seed gave the same text"


@pytest.mark.parametrize("args, says", [
    (["--chat", "hi", "--bogus"], "unknown"),
    (["--chat", "hi", "--temperature", "hot"], "bad value 'hot' for --temperature"),
    (["--chat", "hi", "--top-p", "0"], "--top-p"),
    (["--chat", "hi", "--lookup", "-3"], "--lookup"),
    (["--chat", "hi", "--seed", "x1"], "--seed"),
    (["--chat", "hi", "-n"], "-n needs a value"),
    (["--chat", "hi", "--prompt", "x"], "exactly one of"),
    ([], "exactly one of"),
    (["--prompt", "x", "--system", "s"], "--system goes with --chat"),
])
def test_bad_generate_flags_exit_2(args, says):
    p = run("generate", "--model", smollm2_gguf(), *args)
    assert p.returncode == 2, (args, p.returncode, p.stderr)
    assert says in p.stderr, p.stderr
    assert p.stdout == ""


@pytest.mark.parametrize("args, says", [
    (["--model", "x.gguf", "--what"], "unknown option '--what'"),
    (["--model", "x.gguf", "--min-p", "2"], "--min-p"),
    (["--temp", "1"], "--model is required"),
])
def test_bad_chat_flags_exit_2(args, says):
    p = run("chat", *args, input="")
    assert p.returncode == 2, (args, p.returncode, p.stderr)
    assert says in p.stderr, p.stderr


def test_missing_model_exits_1():
    p = run("generate", "--model", "/nonexistent/model.gguf", "--chat", "hi")
    assert p.returncode == 1 and "kwker generate:" in p.stderr


CHAT_TURNS = ["Hi! What is your name?", "What is 2 + 2?", "Name a famous painter."]


def python_chat(ref, turns, system=None, n_new=N_NEW):
    """The replies of the same conversation through the Python binding."""
    dec, tok = ref
    msgs = [{"role": "system", "content": system}] if system else []
    replies = []
    for u in turns:
        msgs.append({"role": "user", "content": u})
        dec.generate(chat_ids(tok, msgs), max_new_tokens=n_new, tokenizer=tok)
        replies.append(dec.stats["text"])
        msgs.append({"role": "assistant", "content": replies[-1]})
    return replies


def test_chat_through_a_pipe(ref):
    replies = python_chat(ref, CHAT_TURNS, system="You are a friendly assistant.")
    p = run("chat", "--model", smollm2_gguf(), "-t", THREADS, "-n", N_NEW, "--stats",
            "--system", "You are a friendly assistant.", input="\n".join(CHAT_TURNS) + "\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "".join(r + "\n" for r in replies)
    reused = [int(x) for x in re.findall(r"reused (\d+)", p.stderr)]
    prompts = [int(x) for x in re.findall(r"prompt (\d+) tokens", p.stderr)]
    assert len(reused) == 3, p.stderr
    assert reused[0] == 0
    # turns 2 and 3 read only the new turn: everything up to the previous reply is reused
    assert reused[1] > prompts[0] and reused[2] > prompts[1], p.stderr


def test_chat_reset_and_quit(ref):
    before = python_chat(ref, [CHAT_TURNS[0]])[0]
    after = python_chat(ref, [CHAT_TURNS[1]])[0]
    p = run("chat", "--model", smollm2_gguf(), "-t", THREADS, "-n", N_NEW,
            input="%s\n\n/reset\n%s\n/quit\n%s\n" % tuple(CHAT_TURNS))
    assert p.returncode == 0, p.stderr
    # after /reset the second question is answered as the first of a conversation; an empty
    # line is no turn, and nothing after /quit is answered
    assert p.stdout == before + "\n" + after + "\n"
    assert "conversation cleared" in p.stderr


def test_chat_backslash_continues_the_line(ref):
    want = python_chat(ref, ["Say hello\nin French."])[0]
    p = run("chat", "--model", smollm2_gguf(), "-t", THREADS, "-n", N_NEW,
            input="Say hello\\\nin French.\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout == want + "\n"


# --- in a terminal (tmux), as a person uses it ------------------------------------------------

EXITED = re.compile(r"EXIT=\d")


def tmux(*args, check=True):
    return subprocess.run(["tmux"] + list(args), capture_output=True, text=True, check=check)


def wait_for(session, pred, timeout=240):
    deadline = time.time() + timeout
    screen = ""
    while time.time() < deadline:
        screen = tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", session).stdout
        if pred(screen):
            return screen
        time.sleep(0.5)
    raise AssertionError("timed out; the screen was:\n" + screen)


@pytest.fixture
def tmux_session():
    if not shutil.which("tmux"):
        pytest.fail("tmux is not installed: scripts/setup --test installs it")
    name = "kwker-cli-test-%d" % os.getpid()
    tmux("kill-session", "-t", name, check=False)
    tmux("new-session", "-d", "-s", name, "-x", "200", "-y", "50")
    yield name
    tmux("kill-session", "-t", name, check=False)


def test_chat_in_a_terminal(ref, tmux_session):
    s = tmux_session
    reply = python_chat(ref, [CHAT_TURNS[0]], n_new=16)[0]
    cmd = "%s chat --model %s -t 2 -n %%d; echo EXIT=$?" % (kwker_bin(), smollm2_gguf())
    tmux("send-keys", "-t", s, cmd % 16, "Enter")
    wait_for(s, lambda sc: "/reset clears" in sc and sc.rstrip().endswith(">"))
    tmux("send-keys", "-t", s, "-l", CHAT_TURNS[0])
    tmux("send-keys", "-t", s, "Enter")
    first_line = reply.split("\n")[0].strip()
    wait_for(s, lambda sc: first_line in sc and sc.rstrip().endswith(">"))
    tmux("send-keys", "-t", s, "-l", "/quit")
    tmux("send-keys", "-t", s, "Enter")
    wait_for(s, lambda sc: "EXIT=0" in sc)
    tmux("send-keys", "-t", s, "clear", "Enter")
    wait_for(s, lambda sc: not EXITED.search(sc))

    # Ctrl-C while a long reply is being written stops that reply, not the program
    tmux("send-keys", "-t", s, cmd % 400, "Enter")
    wait_for(s, lambda sc: sc.rstrip().endswith(">"))
    ask = "Write a very long story about a brave dragon."
    tmux("send-keys", "-t", s, "-l", ask)
    tmux("send-keys", "-t", s, "Enter")
    wait_for(s, lambda sc: len(sc.rsplit(ask, 1)[-1].strip()) >= 20)
    tmux("send-keys", "-t", s, "C-c")
    screen = wait_for(s, lambda sc: "(reply stopped)" in sc or EXITED.search(sc), timeout=30)
    assert not EXITED.search(screen), screen
    wait_for(s, lambda sc: sc.rstrip().endswith(">"))
    # the program still answers after a stopped reply
    tmux("send-keys", "-t", s, "-l", "Thanks!")
    tmux("send-keys", "-t", s, "Enter")
    wait_for(s, lambda sc: len(sc.rsplit("Thanks!", 1)[-1].strip()) > 1 and
             sc.rstrip().endswith(">"))
    tmux("send-keys", "-t", s, "C-d")
    screen = wait_for(s, lambda sc: EXITED.search(sc))
    assert "EXIT=0" in screen, screen


@pytest.mark.parametrize("args, says", [
    (["--mix-bits", "5"], "--mix-bits"),
    (["--mix-bits"], "--mix-bits"),
    (["--calib"], "--calib"),
    (["--calib-tokens", "0"], "--calib-tokens"),
    (["--act-bits", "4"], "--act-bits"),
    (["--act-bits"], "--act-bits"),
])
def test_bad_packing_flags_exit_2(args, says):
    p = run("generate", "--model", smollm2_gguf(), "--prompt", "x", "--precision", "int4", *args)
    assert p.returncode == 2, (args, p.returncode, p.stderr)
    assert says in p.stderr, p.stderr


def test_packing_flags_refused_with_a_reason(tmp_path):
    p = run("generate", "--model", smollm2_gguf(), "--prompt", "x", "--precision", "int4",
            "--gptq")
    assert p.returncode != 0 and "--gptq needs --calib" in p.stderr, p.stderr
    p = run("generate", "--model", smollm2_gguf(), "--prompt", "x", "--precision", "int4",
            "--calib", tmp_path / "missing.txt")
    assert p.returncode != 0 and "missing.txt" in p.stderr, p.stderr
    p = run("generate", "--model", smollm2_gguf(), "--prompt", "x", "--precision", "balanced",
            "--mix-bits", "6")
    assert p.returncode != 0 and "mix_bits" in p.stderr, p.stderr
    p = run("generate", "--model", smollm2_gguf(), "--prompt", "x", "--precision", "preserve",
            "--act-bits", "8")
    assert p.returncode != 0 and "act_bits 8 applies to balanced and int4" in p.stderr, p.stderr


def test_calibrated_int4_generates_and_is_cached(tmp_path):
    """--calib tokenizes the text with the model's tokenizer; the fitted pack is cached under a
    key of its own, and the second run maps it (same text out). (GPTQ on this model takes minutes
    under the sanitizers: tests/python/test_calib.py covers gptq on tiny models.)"""
    text = tmp_path / "calib.txt"
    text.write_text("The history of the city begins with a small settlement on the river. " * 8)
    args = ["generate", "--model", smollm2_gguf(), "--prompt", "The capital of France is",
            "-n", "8", "-t", THREADS, "--precision", "int4", "--calib", text,
            "--calib-tokens", "64", "--cache-dir", tmp_path / "packs"]
    a = run(*args, timeout=900)
    assert a.returncode == 0, a.stderr
    assert a.stdout.strip()
    packs = list((tmp_path / "packs").glob("*.kwkpack"))
    assert len(packs) == 1, packs
    b = run(*args, timeout=900)
    assert b.returncode == 0 and b.stdout == a.stdout, (a.stdout, b.stdout, b.stderr)
    assert list((tmp_path / "packs").glob("*.kwkpack")) == packs


@pytest.mark.parametrize("prec, lo, hi", [("balanced", 8.4, 8.6), ("int4", 5.5, 6.5)])
def test_bench_json(prec, lo, hi, tmp_path):
    """kwker bench --json: one object with the medians, what the run read per weight, and the
    seconds the model's load and the decoder's making (packing here: an empty cache) took."""
    import json
    p = run("bench", "--model", smollm2_gguf(), "--precision", prec, "-p", "8", "-n", "4",
            "-r", "1", "-t", THREADS, "--json", "--cache-dir", tmp_path)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["precision_name"] == prec and r["n_prompt"] == 8 and r["n_gen"] == 4
    assert r["pp_tps"] > 0 and r["tg_tps"] > 0 and r["peak_rss_kib"] > 0
    assert lo < r["bits_per_weight"] < hi, r
    assert r["act_bits"] == 16, r  # the default
    assert r["load_s"] >= 0 and r["decoder_s"] >= 0, r


@pytest.mark.parametrize("prec", ["preserve", "balanced"])
def test_bench_encoder_json(prec):
    """kwker bench on an encoder: -b sequences of -p tokens a call, embeddings per second, no
    generation (tg_tps null); a -p past the model's positions is refused by name."""
    import json
    import tiny_encoders
    path = tiny_encoders.build("st_mean_norm")  # max_position 128
    p = run("bench", "--model", path, "--precision", prec, "-p", "16", "-b", "3", "-r", "2",
            "-t", THREADS, "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["encoder"] is True and r["precision_name"] == prec, r
    assert r["n_prompt"] == 16 and r["n_seqs"] == 3 and r["reps"] == 2, r
    assert r["tg_tps"] is None and r["pp_tps"] > 0 and r["peak_rss_kib"] > 0, r
    # both printed with 2 decimals: embed_per_s's rounding grows 16 times in pp_tps
    assert abs(r["pp_tps"] - 16 * r["embed_per_s"]) <= 16 * 0.005 + 0.005, r
    p = run("bench", "--model", path, "-p", "129", "-r", "1")
    assert p.returncode == 1 and "at most 128 tokens" in p.stderr, p.stderr
    p = run("bench", "--model", path, "-p", "65536", "-b", "65536", "-r", "1")
    assert p.returncode == 1 and "more than one call takes" in p.stderr, p.stderr
    p = run("bench", "--model", path, "--mix-bits", "8", "-p", "8", "-r", "1")
    assert p.returncode == 1 and "apply to decoders" in p.stderr, p.stderr


@pytest.mark.parametrize("isa", [i for i in supported_isas() if i != "scalar"])
def test_prefetch_level_changes_no_token(isa, tmp_path):
    """KWKER_PREFETCH=l1|l2 moves only where the decode tiles' prefetches go (base/cpu.c): the
    same greedy ids either way, int4 and preserve; the choice is logged at info, and a value
    other than l1 / l2 is warned about and ignored."""
    ids = "1,504,3287,314,2681,1781,30,1838,253,2336,28"
    outs = {}
    for prec in ("int4", "preserve"):
        for pf in ("l1", "l2", "l3"):
            env = cli_env(KWKER_ISA=isa, KWKER_PREFETCH=pf, KWKER_LOG="info",
                          KWKER_CACHE=str(tmp_path))
            p = subprocess.run([kwker_bin(), "generate", "--model", smollm2_gguf(), "-t",
                                THREADS, "--precision", prec, "--ids", ids, "-n", "16"],
                               capture_output=True, text=True, timeout=300, env=env)
            assert p.returncode == 0, p.stderr
            if pf == "l3":
                assert "KWKER_PREFETCH=l3 is not l1|l2; ignored" in p.stderr, p.stderr
            else:
                assert "prefetch to L%s" % pf[1] in p.stderr, p.stderr
            outs[prec, pf] = p.stdout
        assert len(outs[prec, "l1"].split(",")) == 16, outs[prec, "l1"]
        assert outs[prec, "l1"] == outs[prec, "l2"] == outs[prec, "l3"], (prec, outs)


@pytest.mark.parametrize("isa", [i for i in supported_isas() if i != "scalar"])
def test_prefetch_int8_changes_no_token(isa, tmp_path):
    """KWKER_PREFETCH_INT8=on|off turns the int8 decode tiles' prefetches on or off (off is
    AVX-512's default on Zen 5, base/cpu.c): balanced generation gives the same greedy ids
    either way, at 8- and 16-bit activations; the choice is logged at info, and another value is
    warned about and ignored."""
    ids = "1,504,3287,314,2681,1781,30,1838,253,2336,28"
    for act in ("8", "16"):
        outs = {}
        for pf in ("on", "off", "maybe"):
            env = cli_env(KWKER_ISA=isa, KWKER_PREFETCH_INT8=pf, KWKER_LOG="info",
                          KWKER_CACHE=str(tmp_path))
            p = subprocess.run([kwker_bin(), "generate", "--model", smollm2_gguf(), "-t",
                                THREADS, "--precision", "balanced", "--act-bits", act,
                                "--ids", ids, "-n", "16"],
                               capture_output=True, text=True, timeout=300, env=env)
            assert p.returncode == 0, p.stderr
            if pf == "maybe":
                assert "KWKER_PREFETCH_INT8=maybe is not on|off; ignored" in p.stderr, p.stderr
            else:
                assert "int8 decode prefetch: avx512 %s, avx2 %s" % (pf, pf) in p.stderr, p.stderr
            outs[pf] = p.stdout
        assert len(outs["on"].split(",")) == 16, outs["on"]
        assert outs["on"] == outs["off"] == outs["maybe"], (act, outs)


def same_ids_on_off(tmp_path, var, ids, log_line, missing_warning, isa, acts=("8", "16")):
    """Balanced and int4 generation from ids, at the activation widths acts, with var=on, off
    and maybe, under KWKER_ISA=isa (None: the CPU's own path): the same greedy ids every time.
    log_line(value) is what the info log must say of the choice; "maybe" is warned about;
    missing_warning, when not None, is the warning of "on" on a CPU without the feature."""
    for prec in ("balanced", "int4"):
        for act in acts:
            outs = {}
            for v in ("on", "off", "maybe"):
                env = cli_env(KWKER_LOG="info", KWKER_CACHE=str(tmp_path), **{var: v})
                env.pop("KWKER_ISA", None)
                if isa:
                    env["KWKER_ISA"] = isa
                p = subprocess.run([kwker_bin(), "generate", "--model", smollm2_gguf(), "-t",
                                    THREADS, "--precision", prec, "--act-bits", act,
                                    "--ids", ids, "-n", "16"],
                                   capture_output=True, text=True, timeout=300, env=env)
                assert p.returncode == 0, p.stderr
                assert log_line(v) in p.stderr, p.stderr
                if v == "maybe":
                    assert "%s=maybe is not on|off; ignored" % var in p.stderr, p.stderr
                if v == "on" and missing_warning:
                    assert missing_warning in p.stderr, p.stderr
                outs[v] = p.stdout
            assert len(outs["on"].split(",")) == 16, outs["on"]
            assert outs["on"] == outs["off"] == outs["maybe"], (prec, act, outs)


def test_amx_changes_no_token(tmp_path):
    """KWKER_AMX=on|off: the AVX-512 prompt products run their whole 16-token tiles on AMX where
    the CPU has it (amx_quant.c), on vpdpbusd otherwise or when off; both give the same sums and
    the same float epilogue, so balanced and int4 generation after a 40-token prompt (two AMX
    tiles and a rest) give the same greedy ids either way at 16-bit activations (8-bit ones
    change attention too: test_amx_attention_act8). The choice is logged at info ("prompt
    tiles: amx"); "on" without AMX and any other value are warned about and ignored. On a CPU
    without AMX this checks the logging and the warnings."""
    ids = ",".join(str(1 + (i * 7919) % 49000) for i in range(40))
    same_ids_on_off(
        tmp_path, "KWKER_AMX", ids,
        lambda v: "prompt tiles: %s" % ("amx" if cpu_has_amx() and v != "off" else "vector"),
        None if "amx_int8" in cpu_flags() else
        "KWKER_AMX=on: this CPU (or OS) has no AMX-INT8; ignored",
        None, acts=("16",))


def test_amx_attention_act8(tmp_path):
    """With 8-bit activations, KWKER_AMX also chooses the attention table: bf16 products on AMX
    (amx_attn.c) where the CPU has AMX-BF16, on vdpbf16ps when off. The two sum in different
    orders (test_attn checks each against the bf16 statement to rounding) and 8-bit activations
    carry such differences on, so their greedy ids after a nonsense prompt may part (the logits
    of int4 at 8 bits move some 0.25 on average from 16-bit ones either way); what must hold is
    the log's choice and the same quality: perplexity on 8 x 128 tokens of wikitext within 1% of
    each other (measured 0.06% apart; on 2 x 128 tokens 1.3%)."""
    from test_perplexity import WIKITEXT, parse_output
    flags = cpu_flags()
    amx_bf16 = cpu_has_amx() and cpu_has_amx_bf16()
    text = tmp_path / "wiki.txt"
    data = WIKITEXT.read_bytes()
    text.write_bytes(data[:data.index(b"\n", 8000) + 1])
    ppl = {}
    for v in ("on", "off"):
        env = cli_env(KWKER_LOG="info", KWKER_AMX=v)
        env.pop("KWKER_ISA", None)
        p = subprocess.run([kwker_bin(), "perplexity", "--model", smollm2_gguf(), "--file",
                            str(text), "--chunks", "8", "--ctx", "128", "-t", THREADS,
                            "--precision", "int4", "--act-bits", "8", "--cache-dir",
                            str(tmp_path / "packs")],
                           capture_output=True, text=True, timeout=900, env=env)
        assert p.returncode == 0, p.stderr
        want = "amx" if amx_bf16 and v == "on" else ("vector" if "avx512_bf16" in flags and
                                                     "avx512" in supported_isas() else "none")
        assert "bf16 attention: %s" % want in p.stderr, p.stderr
        ppl[v] = parse_output(p.stdout + p.stderr)["ppl_full"]
    assert abs(ppl["on"] / ppl["off"] - 1) < 0.01, ppl


@pytest.mark.skipif("avx2" not in supported_isas(), reason="no AVX2 on this CPU")
def test_avxvnni_changes_no_token(tmp_path):
    """KWKER_AVXVNNI=on|off: the AVX2 quantized kernels use AVX-VNNI's dot products where the CPU
    has them (avxvnni_quant.c), maddubs otherwise or when off; both give the same sums, so
    balanced and int4 generation under KWKER_ISA=avx2 give the same greedy ids either way, at
    8- and 16-bit activations. The choice is logged at info; "on" without the instructions and
    any other value are warned about and ignored."""
    has = "avx_vnni" in cpu_flags()
    same_ids_on_off(
        tmp_path, "KWKER_AVXVNNI", "1,504,3287,314,2681,1781,30,1838,253,2336,28",
        lambda v: "avx2 dot products: %s" % ("avx-vnni" if has and v != "off" else "maddubs"),
        None if has else "KWKER_AVXVNNI=on: this CPU has no AVX-VNNI; ignored",
        "avx2")
