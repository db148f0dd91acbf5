#!/usr/bin/env python3
r"""Writes tests/data/tokenizer/hf/: three small Hugging Face tokenizer.json files and their golden ids.

The first two are byte-level BPE tokenizers trained with the `tokenizers` package on the committed
corpus (tests/data/tokenizer/corpus.txt, documents separated by lines holding `%`); the package builds
the third from a vocabulary given whole, in the shape of torchtitan's own test tokenizer:

    hf/llama3/tokenizer.json, tokenizer_config.json
        Llama 3's layout (torchtitan's test assets folder): Split(Llama 3's regex, isolated) then
        ByteLevel(use_regex=false), ignore_merges, Llama 3.1's 256 special tokens as added tokens
        after the base vocabulary, bos/eos named in tokenizer_config.json.
    hf/gpt2/tokenizer.json
        GPT-2's layout: ByteLevel(use_regex=true) with GPT-2's regex, merges always applied,
        <|endoftext|> as the one special token, no tokenizer_config.json.
    hf/torchtitan/tokenizer.json, tokenizer_config.json
        the shape of torchtitan's tests/assets/tokenizer/tokenizer.json (made here, not copied):
        BPE with "merges": [] (empty), unk_token null, byte_fallback false; pre_tokenizer,
        post_processor and decoder ByteLevel (add_prefix_space false, use_regex true), normalizer
        null. The vocabulary is NOT in ByteLevel's byte alphabet: ids 0..127 are the raw characters
        of bytes 0..127 (as JSON writes them: "\u0000", "\t", " ", "A", DEL unescaped), ids
        128..255 the 4-character strings "\\x80".."\\xff" (a backslash, x, two hex digits), then
        ~1,700 multi-character tokens (those of a ByteLevel BPE trained on the corpus whose bytes
        are UTF-8, each written as the raw text of its bytes: " the", "\n\n", "é", " ال"), then
        three special added tokens. So under the package a byte whose alphabet character ("Ġ" for
        a space) is not a key is dropped from the text, nothing can be merged, and decoding maps a
        token through the inverse alphabet when all its characters are in it ("é" -> the byte
        0xe9) and keeps its UTF-8 otherwise (" the"; "\u0000" -> a NUL byte).
    hf/golden.txt
        <tokenizer> TAB <all|none> TAB <text as lowercase hex, or -> TAB <ids separated by spaces>
        (a "none" line's text "=" is the line before's; its ids "=" are the same as that line's)
        for ~60 strings, encoded with add_special_tokens=False; "all" is the package's default (added
        tokens in the text become their ids), "none" sets encode_special_tokens=True (special tokens
        are plain text). "gpt2-prefix" is gpt2 with ByteLevel's add_prefix_space set to true;
        "qwen2-nfc" is llama3 with Qwen2's regex (single digits) and normalizer NFC: ctitan encodes
        text already in NFC and refuses the rest, so its ids are "!" where NFC changes the text.
        "torchtitan" lines (and "torchtitan-ignore": the same file with ignore_merges true, on the
        strings of at most 300 bytes) carry a fifth column, the package's decode of the ids
        (skip_special_tokens=False) as UTF-8 hex (- if empty; = the line before's), since decoding
        does not give the text back; "decode" lines are <tokenizer> TAB decode TAB <ids> TAB
        <decode as hex> for hand-picked ids. The package's decode is a Python str: bytes that are not
        UTF-8 come out as U+FFFD (Rust's from_utf8_lossy).

tests/unit/test_hf_tokenizer.c must reproduce every id and decode. Run from the repository root
with a Python that has `tokenizers`:

    /tmp/venv/bin/python tests/golden/gen_hf_tokenizer_golden.py          # writes the files
    /tmp/venv/bin/python tests/golden/gen_hf_tokenizer_golden.py --check  # compares, writes nothing
"""
import json
import os
import random
import sys
import unicodedata

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

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


def byte_alphabet():
    """ByteLevel's alphabet: {character: byte} (GPT-2's bytes_to_unicode, inverted)."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    alphabet = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in printable]   # U+0100.. in byte order
    alphabet.update({chr(256 + k): b for k, b in enumerate(others)})
    return alphabet


TT_SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>"]
TT_MULTI = 2100   # the trained tokenizer's vocabulary; its tokens past the alphabet that are UTF-8 stay


def torchtitan():
    """torchtitan's test tokenizer's shape (see the docstring), built from a vocabulary given whole."""
    vocab = {}
    for b in range(256):
        vocab[chr(b) if b < 128 else "\\x%02x" % b] = b
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(vocab_size=TT_MULTI, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    trained.train_from_iterator(documents(), trainer=trainer)
    alphabet = byte_alphabet()
    for text, _ in sorted(trained.get_vocab().items(), key=lambda kv: kv[1]):
        if len(text) == 1:
            continue   # one of the 256 bytes
        try:
            raw = bytes(alphabet[c] for c in text).decode("utf-8")
        except UnicodeDecodeError:
            continue   # part of a character: not text, so torchtitan's kind of file cannot hold it
        assert raw not in vocab, raw
        vocab[raw] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(TT_SPECIALS)
    d = json.loads(tok.to_str())   # the shape promised above, as the package writes it
    assert d["model"]["merges"] == [] and d["model"]["unk_token"] is None and not d["model"]["byte_fallback"]
    assert d["normalizer"] is None and all(a["special"] for a in d["added_tokens"])
    assert list(d["model"]["vocab"])[:3] == ["\0", "\x01", "\x02"]
    return tok


def tt_decode_ids(tok):
    """Hand-picked ids whose decode golden.txt records: raw control characters, the "\\xNN" strings,
    multi-character tokens inside and outside the alphabet, specials, and mixes of them."""
    v = tok.get_vocab()
    picks = [[0], [9], [10], [32], [127], [128], [255], [v[" the"]], [v["\n\n"]], [v["\n\t"]],
             [v["é"]], [v["ón"]], [v["é"], v["ó"]], [v[" ال"]], [v["<|endoftext|>"]],
             [v["<|begin_of_text|>"], v[" the"], 0, 128, 33, v["<|end_of_text|>"]]]
    alphabet = byte_alphabet()
    mixed = sorted(t for t in v if any(c in alphabet and ord(c) > 126 for c in t)
                   and any(c not in alphabet for c in t))
    picks += [[v[t]] for t in mixed[:3]]   # one character in the alphabet, one not: kept as UTF-8
    picks.append(list(range(0, 260)))
    return picks


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


def decode_hex(tok, ids):
    return tok.decode(ids, skip_special_tokens=False).encode("utf-8").hex() or "-"


def golden_lines(name, tok, texts, nfc=False, decodes=False):
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
        if decodes:   # the text does not come back: the decode is a column of its own
            lines.append("%s\tall\t%s\t%s\t%s" % (name, hex_text, " ".join(map(str, special)),
                                                 decode_hex(tok, special)))
            lines.append("%s\tnone\t=\t%s" % (name, "=\t=" if plain == special else " ".join(map(str, plain))
                                                + "\t" + decode_hex(tok, plain)))
            continue
        if not name.endswith("-prefix"):   # add_prefix_space adds a space that decoding keeps
            assert tok.decode(plain, skip_special_tokens=False) == text, (name, text)
        lines.append("%s\tall\t%s\t%s" % (name, hex_text, " ".join(map(str, special))))
        lines.append("%s\tnone\t%s\t%s" % (name, "=", "=" if plain == special else " ".join(map(str, plain))))
    return lines


def with_ignore_merges(tok):
    d = json.loads(tok.to_str())
    d["model"]["ignore_merges"] = True
    return Tokenizer.from_str(json.dumps(d))


TT_TEXTS = [   # besides cases(): what torchtitan's kind of vocabulary makes interesting
    "\\x80 and \\xff are text here, \\x00 too",
    "é",
    "Ã© is é in ByteLevel's alphabet",
    "the\tthe\nthe the\r\n",
    "<|begin_of_text|>the end<|end_of_text|>",
    "\x00\x01\x02\x1f\x7f\x80\xff",
]


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
    l3, g2, tt = llama3(), gpt2(), torchtitan()
    files = {
        "llama3/tokenizer.json": l3.to_str(pretty=True) + "\n",
        "llama3/tokenizer_config.json": json.dumps({
            "bos_token": "<|begin_of_text|>",
            "eos_token": {"content": "<|end_of_text|>", "lstrip": False, "normalized": False,
                          "rstrip": False, "single_word": False},
            "model_max_length": 131072,
            "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2) + "\n",
        "gpt2/tokenizer.json": g2.to_str(pretty=True) + "\n",
        "torchtitan/tokenizer.json": tt.to_str(pretty=True) + "\n",
        "torchtitan/tokenizer_config.json": json.dumps({
            "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
            "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2) + "\n",
    }
    lines = ["# generated by tests/golden/gen_hf_tokenizer_golden.py (tokenizers %s); do not edit"
             % tokenizers.__version__,
             "# tokenizer<TAB>mode<TAB>text as hex (- if empty; = the line before's)<TAB>ids "
             "(= the line before's; ! refused)"]
    lines += golden_lines("llama3", l3, texts)
    lines += golden_lines("gpt2", g2, texts)
    lines += golden_lines("gpt2-prefix", with_prefix_space(g2), texts)
    lines += golden_lines("qwen2-nfc", qwen2_nfc(l3), texts, nfc=True)
    lines += golden_lines("torchtitan", tt, texts + TT_TEXTS, decodes=True)
    short = [t for t in texts + TT_TEXTS if len(t.encode()) <= 300]   # whole pieces are short
    lines += golden_lines("torchtitan-ignore", with_ignore_merges(tt), short, decodes=True)
    for ids in tt_decode_ids(tt):
        lines.append("torchtitan\tdecode\t%s\t%s" % (" ".join(map(str, ids)), decode_hex(tt, ids)))
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
