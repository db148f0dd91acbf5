#!/usr/bin/env python3
"""Writes tests/data/tokenizer/hf/: two small Hugging Face tokenizer.json files and their golden ids.

Both are byte-level BPE tokenizers trained with the `tokenizers` package on the committed corpus
(tests/data/tokenizer/corpus.txt, documents separated by lines holding `%`):

    hf/llama3/tokenizer.json, tokenizer_config.json
        Llama 3's layout (torchtitan's test assets folder): Split(Llama 3's regex, isolated) then
        ByteLevel(use_regex=false), ignore_merges, Llama 3.1's 256 special tokens as added tokens
        after the base vocabulary, bos/eos named in tokenizer_config.json.
    hf/gpt2/tokenizer.json
        GPT-2's layout: ByteLevel(use_regex=true) with GPT-2's regex, merges always applied,
        <|endoftext|> as the one special token, no tokenizer_config.json.
    hf/golden.txt
        <tokenizer> TAB <all|none> TAB <text as lowercase hex, or -> TAB <ids separated by spaces>
        (a "none" line's text "=" is the line before's; its ids "=" are the same as that line's)
        for ~60 strings, encoded with add_special_tokens=False; "all" is the package's default (added
        tokens in the text become their ids), "none" sets encode_special_tokens=True (special tokens
        are plain text). "gpt2-prefix" is gpt2 with ByteLevel's add_prefix_space set to true;
        "qwen2-nfc" is llama3 with Qwen2's regex (single digits) and normalizer NFC: ctitan encodes
        text already in NFC and refuses the rest, so its ids are "!" where NFC changes the text.

tests/unit/test_hf_tokenizer.c must reproduce every id. Run from the repository root with a Python
that has `tokenizers`:

    /tmp/venv/bin/python tests/golden/gen_hf_tokenizer_golden.py          # writes the files
    /tmp/venv/bin/python tests/golden/gen_hf_tokenizer_golden.py --check  # compares, writes nothing
"""
import json
import os
import random
import sys
import unicodedata

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data", "tokenizer")
OUT = os.path.join(DATA, "hf")
CORPUS = os.path.join(DATA, "corpus.txt")
VOCAB_SIZE = 1500   # base vocabulary (256 bytes + merges); specials come after it

LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
            "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
SPECIALS += [f"<|reserved_special_token_{3 + i}|>" for i in range(256 - len(SPECIALS))]


def documents():
    text = open(CORPUS, encoding="utf-8", newline="").read()
    docs, cur = [], []
    for line in text.split("\n"):
        if line.rstrip("\r") == "%":
            docs.append("".join(cur))
            cur = []
        else:
            cur.append(line + "\n")
    docs.append("".join(cur)[:-1])
    return [d for d in docs if d]


def train(pre, ignore_merges, specials):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(documents(), trainer=trainer)
    tok.add_special_tokens(specials)
    return tok


def llama3():
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    return train(pre, True, SPECIALS)


def gpt2():
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    return train(pre, False, ["<|endoftext|>"])


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
        "It was the best of times, it was the worst of times, it was the age of wisdom.",
        "Café crème brûlée, naïve façade, Ångström, señor, Größe, œuvre.",
        "Die Straße ist schön; Äpfel, Öl und Übermut. Fußgängerübergänge!",
        "我们的中文句子很简单。日本語のテキストです。한국어 문장입니다.",
        "I ❤️ pizza 🍕 and the family emoji 👩‍👩‍👧‍👦! 🎉🎉🎉 👍🏽 🇫🇷🇯🇵 🏳️‍🌈",
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
        "<|endoftext|>",
        "one<|endoftext|>two <|endoftext|> three<|endoftext|><|endoftext|>\n",
        " <|endoftext|>  x",
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
        "the the the there then them theme thermal",
        "of of and and in in to to",
        "Ёлка, ёж, щука, объявление; Ελληνικά: ή, ώ, ϊ",
        "कृपया ध्यान दें: यह एक परीक्षण है।",
        "東京は日本の首都です。カタカナとひらがな、漢字。",
        "서울특별시는 대한민국의 수도이다. 안녕하세요!",
        "👨‍💻👩🏿‍🚀🧑‍🤝‍🧑 ✋🏻✋🏼✋🏽✋🏾✋🏿 #️⃣ 1️⃣",
        "snake_case camelCase PascalCase SCREAMING_CASE kebab-case",
        "    if (x) {\n        y();\n    }\n",
        "0x1F 0b1010 1e-9 -42 +7 3.0f 1_000_000",
        "Hello\u00a0\u00a0world\u3000\u3000!",
        "ÀÁÂÃÄÅ àáâãäå ÇçÑñ ÿŸ",
        "Qwen2 splits digits: 1234567890 and 3.14",
        "e\u0301\u0323 é\u0323 a\u0308\u0301",
        "\u1100\u1161\u11a8 가\u11a8 한국어",
        "\u2126 \u212b \u0915\u093c \u0929 \u0928\u093c",
    ]


def golden_lines(name, tok, texts, nfc=False):
    lines = []
    for text in texts:
        hex_text = text.encode("utf-8").hex() or "-"
        if nfc and unicodedata.normalize("NFC", text) != text:
            lines.append("%s\tall\t%s\t!" % (name, hex_text))
            lines.append("%s\tnone\t=\t!" % name)
            continue
        tok.encode_special_tokens = False
        special = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        plain = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        if not name.endswith("-prefix"):   # add_prefix_space adds a space that decoding keeps
            assert tok.decode(plain, skip_special_tokens=False) == text, (name, text)
        lines.append("%s\tall\t%s\t%s" % (name, hex_text, " ".join(map(str, special))))
        lines.append("%s\tnone\t%s\t%s" % (name, "=", "=" if plain == special else " ".join(map(str, plain))))
    return lines


def with_prefix_space(tok):
    d = json.loads(tok.to_str())
    d["pre_tokenizer"]["add_prefix_space"] = True
    return Tokenizer.from_str(json.dumps(d))


def qwen2_nfc(tok):
    d = json.loads(tok.to_str())
    d["normalizer"] = {"type": "NFC"}
    d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN2_PAT
    return Tokenizer.from_str(json.dumps(d))


def build():
    """The files to write, as {relative path: text}."""
    texts = cases()
    l3, g2 = llama3(), gpt2()
    files = {
        "llama3/tokenizer.json": l3.to_str(pretty=True) + "\n",
        "llama3/tokenizer_config.json": json.dumps({
            "bos_token": "<|begin_of_text|>",
            "eos_token": {"content": "<|end_of_text|>", "lstrip": False, "normalized": False,
                          "rstrip": False, "single_word": False},
            "model_max_length": 131072,
            "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2) + "\n",
        "gpt2/tokenizer.json": g2.to_str(pretty=True) + "\n",
    }
    lines = ["# generated by tests/golden/gen_hf_tokenizer_golden.py (tokenizers %s); do not edit"
             % tokenizers.__version__,
             "# tokenizer<TAB>mode<TAB>text as hex (- if empty; = the line before's)<TAB>ids "
             "(= the line before's; ! refused)"]
    lines += golden_lines("llama3", l3, texts)
    lines += golden_lines("gpt2", g2, texts)
    lines += golden_lines("gpt2-prefix", with_prefix_space(g2), texts)
    lines += golden_lines("qwen2-nfc", qwen2_nfc(l3), texts, nfc=True)
    files["golden.txt"] = "\n".join(lines) + "\n"
    return files


def main():
    check = "--check" in sys.argv[1:]
    files = build()
    bad = 0
    for rel, text in sorted(files.items()):
        path = os.path.join(OUT, rel)
        if check:
            try:
                same = open(path, encoding="utf-8", newline="").read() == text
            except OSError:
                same = False
            if not same:
                print(f"{path}: differs from what the generator makes")
                bad += 1
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
        print(f"wrote {path} ({len(text.encode())} bytes)")
    if check:
        print("check: %s" % ("all files match" if not bad else f"{bad} file(s) differ"))
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
