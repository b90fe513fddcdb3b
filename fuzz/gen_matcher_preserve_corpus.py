#!/usr/bin/env python3
"""gen_matcher_preserve_corpus.py - writes the seed corpus of fuzz_matcher_preserve.c: a GBNF
grammar, a NUL, then a script of the target's operations. Token ids are those of the target's
vocabulary (plain tokens 0..33, a hole at 34, the added tokens from 35); keep them in step."""
import os

# the target's ids
LB, RB, LC, RC, QUOTE, A, B, TOOL, CALL, TOOLU, CALLSU, LT, GT = 4, 5, 6, 7, 8, 13, 14, 18, 19, 20, 21, 0, 1
C3, A9 = 28, 29
HOLE, T_CALL, T_CALL_END, T_CALLS, T_PY, T_EOS, T_R1, T_TOOL, T_X, N_VOCAB = range(34, 44)
SPECIALS = [T_CALL, T_CALL_END, T_CALLS, T_PY, T_EOS, T_R1, T_TOOL]


def tok(i):
    return bytes([i + 1])  # the target's id_of: byte % (N_VOCAB + 3) - 1


def preserve(*ids, mode=0):
    return bytes([0, mode << 6 | len(ids)]) + b"".join(tok(i) for i in ids)


MASK, RESET, FLUSH, DONE = b"\x01", b"\x05", b"\x06", b"\x07"


def pick(k):
    return bytes([2, k])


def accept(i):
    return b"\x03" + tok(i)


def raw(s):
    return bytes([4, len(s)]) + s


SEEDS = {
    # Mistral's marker: refused until preserved; invalid ids ignored; taken as its text, then
    # spelled in plain tokens after a reset.
    "mistral": (b'root ::= "[TOOL_CALLS]" "[" [a-b]* "]"',
                MASK + accept(T_CALLS) + preserve(T_CALLS, A, -1, N_VOCAB, HOLE, T_CALLS) + MASK +
                accept(T_CALLS) + MASK + pick(0) + pick(1) + accept(RB) + DONE + RESET +
                accept(LB) + accept(TOOLU) + accept(CALLSU) + accept(RB) + MASK + DONE),
    # Hermes: "<tool" (special, a prefix of "<tool_call>") then the rest spelled; the closing
    # marker preserved after masks were cached; tables dropped midway.
    "hermes": (b'root ::= "<tool_call>" "{" "\\"" [a-b]+ "\\"" "}" "</tool_call>"',
               preserve(T_TOOL, T_CALL) + MASK + accept(T_TOOL) + accept(CALL) + accept(GT) +
               MASK + accept(LC) + accept(QUOTE) + pick(0) + FLUSH + pick(1) + accept(QUOTE) +
               accept(RC) + MASK + preserve(T_CALL_END) + MASK + accept(T_CALL_END) + DONE +
               RESET + MASK + accept(T_CALL) + MASK + DONE),
    # Llama 3.1's python tag after text; the error cases of preserve.
    "python_tag": (b'root ::= [a-z ]* ("<|python_tag|>" [a-z_]*)?',
                   MASK + preserve(T_PY) + MASK + raw(b"ab ") + accept(T_PY) + MASK + pick(3) +
                   DONE + RESET + bytes([0, 0x43]) + bytes([0, 0x80]) + bytes([0, 0x00]) +
                   preserve(mode=1) + MASK + DONE),
    # DeepSeek R1's multi-byte marker, eos preserved as text, a character cut across calls.
    "r1_utf8": ('root ::= "<｜tool▁calls▁begin｜>" [^<]* "</s>"'.encode(),
                preserve(T_R1, T_EOS) + MASK + accept(T_R1) + MASK + accept(C3) + MASK +
                accept(A9) + pick(5) + accept(T_EOS) + DONE + MASK),
    # Any text: every special token once all are preserved; flushes between masks.
    "any": (b"root ::= .*",
            MASK + preserve(*SPECIALS) + MASK + FLUSH + MASK + pick(40) + FLUSH + pick(7) +
            accept(T_X) + accept(T_EOS) + MASK + DONE),
}

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "fuzz_matcher_preserve")
os.makedirs(out, exist_ok=True)
for name, (grammar, script) in SEEDS.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(grammar + b"\0" + script)
# no NUL: the grammar alone, every special token preserved
with open(os.path.join(out, "grammar_only"), "wb") as f:
    f.write(b'root ::= "<tool_call>" [a-b]* "</tool_call>"')
