#!/usr/bin/env python3
"""Writes tests/data/tokenizer/golden.txt: what tiktoken makes of ~50 strings with our vocabulary.

The vocabulary (tests/data/tokenizer/vocab.tiktoken) was trained by ctitan's own C trainer on the
committed corpus:

    build/ctitan tokenizer train --input tests/data/tokenizer/corpus.txt --split-on % \
        --vocab-size 1024 --output tests/data/tokenizer/vocab.tiktoken

This script first checks that vocabulary against a naive Python BPE trainer (recount every pair after
every merge; same tie rule: most frequent pair, then lowest (left, right) rank), then encodes every
case with tiktoken, once with allowed_special="all" and once as ordinary text, and writes

    # comment lines
    <all|none> TAB <text as lowercase hex, or -> TAB <ids separated by spaces>

tests/unit/test_tokenizer.c must reproduce every id. Run from the repository root:

    python3 tests/golden/gen_tokenizer_golden.py
"""
import base64
import collections
import os
import random
import sys

# tiktoken caches every file it loads, local ones too, under a key made from the path alone: a
# retrained vocabulary at the same path would be read stale. An empty cache directory turns that off.
os.environ["TIKTOKEN_CACHE_DIR"] = ""

import regex  # noqa: E402
import tiktoken  # noqa: E402
import tiktoken.load  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data", "tokenizer")
VOCAB = os.path.join(DATA, "vocab.tiktoken")
CORPUS = os.path.join(DATA, "corpus.txt")
GOLDEN = os.path.join(DATA, "golden.txt")
VOCAB_SIZE = 1024

PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
       r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Llama 3.1's 256 special tokens, in id order.
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
            "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
SPECIALS += [f"<|reserved_special_token_{3 + i}|>" for i in range(256 - len(SPECIALS))]


def naive_train(docs, vocab_size):
    counts = collections.Counter()
    for d in docs:
        for m in regex.findall(PAT, d):
            counts[m.encode()] += 1
    words = [[list(w), c] for w, c in counts.items()]
    vocab = [bytes([b]) for b in range(256)]
    index = {v: i for i, v in enumerate(vocab)}
    while len(vocab) < vocab_size - 256:
        pairs = collections.Counter()
        for s, c in words:
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        joined = vocab[best[0]] + vocab[best[1]]
        if joined not in index:
            index[joined] = len(vocab)
            vocab.append(joined)
        new = index[joined]
        for w in words:
            s, out, i = w[0], [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(new)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            w[0] = out
    return vocab


def check_vocab(ranks):
    text = open(CORPUS, encoding="utf-8", newline="").read()
    docs, cur = [], []
    for line in text.split("\n"):
        if line.rstrip("\r") == "%":
            docs.append("".join(cur))
            cur = []
        else:
            cur.append(line + "\n")
    docs.append("".join(cur)[:-1])   # the last line had no "\n" unless the file ended with one
    docs = [d for d in docs if d]
    want = naive_train(docs, VOCAB_SIZE)
    got = sorted(ranks, key=ranks.get)
    if got != want:
        n = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        sys.exit(f"{VOCAB} differs from the naive trainer at rank {n} "
                 f"({got[n:n+1]} vs {want[n:n+1]}); retrain it with the C trainer")


def cases():
    rng = random.Random(1234)
    letters = "abcdefghijklmnopqrstuvwxyz"
    long_random = "".join(rng.choice(letters) for _ in range(2000))
    long_mixed = "".join(rng.choice(["the ", "and ", "ing", "e", "th", "é", "中", " ", "\n", "12",
                                     "'s", "!!", "Ж", "😀"]) for _ in range(1000))
    return [
        "",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
        "age of foolishness, it was the epoch of belief, it was the epoch of incredulity.",
        "Café crème brûlée, naïve façade, Ångström, señor, Größe, œuvre.",
        "我们的中文句子很简单。日本語のテキストです。한국어 문장입니다.",
        "I ❤️ pizza 🍕 and the family emoji 👩‍👩‍👧‍👦! 🎉🎉🎉 👍🏽 🇫🇷🇯🇵",
        "Привет, мир! Как дела? Москва — большой город.",
        "مرحبا بالعالم! שלום עולם! 123 مرحبا",
        "Γειά σου Κόσμε! ΑΒΓ αβγ; नमस्ते दुनिया; สวัสดีชาวโลก; Xin chào thế giới",
        "1234567 and 12 345 678.90, year 2024, pi=3.14159265358979, 00000007, 1,000,000",
        "Unicode digits: ٣٤٥ ४५६ ①②③ ½ 𝟙𝟚𝟛 and letters 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
        "a    b\t\tc   \n\n\n   d",
        "\tindented\n\t\tmore indented\n\t\t\tthird",
        "line one\r\nline two\r\n\r\nend\r\n",
        "trailing spaces   ",
        "   leading spaces",
        "   \n  \t ",
        " ",
        "\n",
        "I'm, you're, HE'S, they've, We'LL, it'd, don't, CAN'T, She'D, 'S 'T 'RE 'VE 'M 'LL 'D",
        "it’s curly ’s vs straight 's, rock'n'roll, '''quoted''', ''",
        "Wait... what?!? (yes) [no] {maybe} <tag/> --> ==> ;; @#$%^&*~`|\\",
        "<|begin_of_text|>Hello<|end_of_text|>",
        "x<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi there<|eot_id|>",
        "<|not_special|> <|begin_of_text| <|<|eot_id|> |><| <||> <|python_tag|>code",
        "<|reserved_special_token_247|> vs <|reserved_special_token_248|>, "
        "<|reserved_special_token_2|><|finetune_right_pad_id|><|eom_id|>",
        "def square(x):\n    return x ** 2  # a comment\n\nprint(square(12))\n",
        "for (int i = 0; i < n; i++) { sum += a[i]; }  // C\n",
        "https://example.com/path/to/page?query=1&b=two#frag",
        "Pneumonoultramicroscopicsilicovolcanoconiosis " + "a" * 300,
        long_random,
        long_mixed,
        "abcабвαβγ中文123def4567",
        "a\u00a0b\u2003c\u3000d\u2028e\u0085f\u000bg\u000ch\u180ei\ufeffj",
        "e\u0301 vs é, n\u0303, a\u200bb\u200dc",
        "∑∫√∞ ≤ ≥ ≠ ± × ÷ → E = mc². x² + y²",
        "end.\n   \n\nNext paragraph.\n \n",
        " " * 1000 + "x",
        "\n" * 50 + "y" + " \n" * 20,
        "a\x00b\x01c\x7f\x1f",
        "Q: What is the meaning of life?\nA: 42.\n%\nAnother fortune.\n",
        "The rain in Spain stays mainly in the plain. The rain in Spain stays mainly in the plain.",
        "DON'T SHOUT! I'M NOT SHOUTING, YOU'RE SHOUTING!!!",
        "“Quotes” — dashes – and… ellipses • bullets © ® ™ € £ ¥",
        "tabs\tbetween\twords\tand\ttrailing\t",
        "mixed  \t \n\t  whitespace \r\n\r\n  run",
        "😀" * 20 + "中" * 20 + "é" * 20,
    ]


def main():
    ranks = tiktoken.load.load_tiktoken_bpe(VOCAB)
    check_vocab(ranks)
    n = len(ranks)
    enc = tiktoken.Encoding(name="ctitan-test", pat_str=PAT, mergeable_ranks=ranks,
                            special_tokens={s: n + i for i, s in enumerate(SPECIALS)})
    lines = ["# generated by tests/golden/gen_tokenizer_golden.py from vocab.tiktoken "
             f"(tiktoken {tiktoken.__version__}); do not edit",
             "# mode<TAB>text as hex (- if empty)<TAB>ids"]
    all_cases = cases()
    for text in all_cases:
        hex_text = text.encode("utf-8").hex() or "-"
        special = enc.encode(text, allowed_special="all")
        plain = enc.encode_ordinary(text)
        assert enc.decode(special) == text and enc.decode(plain) == text
        lines.append("all\t%s\t%s" % (hex_text, " ".join(map(str, special))))
        lines.append("none\t%s\t%s" % (hex_text, " ".join(map(str, plain))))
    with open(GOLDEN + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(GOLDEN + ".tmp", GOLDEN)
    print(f"wrote {GOLDEN}: {len(all_cases)} strings x 2 modes")


if __name__ == "__main__":
    main()
