"""Prints tests/c/test_tokenizer_pair.c's truncation table: {na, nb, max_length, kept of a, kept
of b} as transformers gives them for tokenizer("a a ...", "b b ...", truncation=True,
max_length=max_length) with all-MiniLM-L6-v2's tokenizer (one token a word, BERT's pair form:
three special tokens). Run from the repository root:
    python3 tests/golden/make_tokenizer_pair_table.py

Batched, as cross-encoders call it: transformers 5 encodes an unbatched tokenizer(a, "") as the
single text a (tokenization_utils_tokenizers.py: `[(text, text_pair)] if text_pair else
[text]`), where the batched call and the tokenizers library keep the pair form.
"""
import os

from transformers import AutoTokenizer

DATA = os.environ.get("KWKER_SHARED_DATA", "../shared/data")
tok = AutoTokenizer.from_pretrained(DATA + "/tokenizers/bert-uncased/all-MiniLM-L6-v2")
rows = []
for na in (0, 1, 2, 5, 8):
    for nb in (0, 1, 2, 5, 8):
        for m in (3, 4, 5, 6, 7, 8, 10, 13):
            ids = tok([" ".join("a" * na)], [" ".join("b" * nb)], truncation=True,
                      max_length=m)["input_ids"][0]
            rows.append("{%d, %d, %d, %d, %d}" % (na, nb, m, ids.count(1037), ids.count(1038)))
for i in range(0, len(rows), 5):
    print("    " + ", ".join(rows[i:i + 5]) + ",")
