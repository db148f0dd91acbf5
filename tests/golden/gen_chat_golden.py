#!/usr/bin/env python3
"""Golden shards for `ctitan tokenize --format chat` (tests/cli/tokenize_chat.sh), from transformers.

Writes into tests/golden/chat/:
  conversations.jsonl          the conversations (system prompts, multi-turn, prompt/completion pairs,
                               unicode, one longer than a sequence, one without an assistant turn)
  llama3/tokenizer_config.json a Llama 3-style template (Meta's Llama 3 Instruct one, no generation
                               blocks); its tokenizer.json is tests/data/tokenizer/hf/llama3's
  qwen/tokenizer_config.json   a Qwen2.5-style ChatML template (tools, a default system prompt); its
                               tokenizer.json is the same one with three reserved specials renamed
                               <|im_start|>, <|im_end|>, <|endoftext|> (qwen_tokenizer_json below; the
                               test makes it with sed)
  generation_prompts.txt       three prompts as one user message with the generation prompt, per case:
                               transformers' ids (tests/cli/generate_chat.sh)
  renders.json                 Jinja snippets and the fuzz corpus's templates (tests/fuzz/corpus/jinja)
                               rendered by transformers' Jinja environment, for tests/unit/test_jinja.c
  CASE.bin                     the token shard each case must write, word for word (version 4: bit 31 of
                               a word masks it as a target, bit 30 marks a conversation's first token),
                               and CASE.txt, each conversation's ids and
                               mask as transformers gives them, for reading a difference

Cases: llama3_config and qwen_config (the folders' templates), llama3_builtin and chatml_builtin
(ctitan's built-in templates, copied here, on the same folders). Ids come from transformers'
apply_chat_template(tokenize=True). Masks: for the built-in templates (which hold {% generation %}
blocks) transformers' return_assistant_tokens_mask; for the folders' templates (which hold none) the
rule ctitan documents (the text that rendering messages[0..i] adds to messages[0..i-1] with the
generation prompt, less trailing whitespace, for each assistant message i), computed here from
transformers' renders and the tokenizers package's offsets, and checked equal to transformers' mask
of the built-in template of the same family, so both routes give one answer.

Packing as ctitan documents it: first fit into blocks of SEQ tokens, EOS after a conversation when its
block has room, EOS padding, one EOS at the end; a conversation longer than SEQ, or with no assistant
token after its first, is dropped.

Run with a Python that has transformers 5.x and tokenizers: python3 tests/golden/gen_chat_golden.py
"""
import json
import os
import shutil
import struct
import sys
import tempfile
import zlib

from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "chat")
BASE_TOKENIZER = os.path.join(ROOT, "tests/data/tokenizer/hf/llama3/tokenizer.json")
SEQ = 128
MASKED = 1 << 31
DOC_START = 1 << 30

CONVERSATIONS = [
    {"messages": [{"role": "system", "content": "You are a terse assistant."},
                  {"role": "user", "content": "What is the capital of France?"},
                  {"role": "assistant", "content": "Paris."}]},
    {"messages": [{"role": "user", "content": "Count to three."},
                  {"role": "assistant", "content": "One, two, three."},
                  {"role": "user", "content": "Now backwards."},
                  {"role": "assistant", "content": "Three, two, one."}]},
    {"prompt": "Name a primary colour.", "completion": "Blue."},
    {"messages": [{"role": "user", "content": "Traduis « bonjour » en allemand."},
                  {"role": "assistant", "content": "Guten Tag — ou « Hallo ». 👋"}]},
    {"messages": [{"role": "system", "content": "  Answer in one word.  \n"},
                  {"role": "user", "content": "  Opposite of hot?\n"},
                  {"role": "assistant", "content": "\n Cold. \n"}]},
    {"messages": [{"role": "user", "content": "日本の首都は?"},
                  {"role": "assistant", "content": "東京です。"}]},
    {"messages": [{"role": "system", "content": "Be kind."},
                  {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": "How are you?"},
                  {"role": "assistant", "content": "Well, thanks."},
                  {"role": "user", "content": "Bye"},
                  {"role": "assistant", "content": "Goodbye."}]},
    {"messages": [{"role": "user", "content": "Write a Python one-liner that prints 1 to 3."},
                  {"role": "assistant", "content": "```python\nprint(*range(1, 4))\n```"}]},
    {"prompt": [{"role": "user", "content": "2 + 2?"}], "completion": [{"role": "assistant", "content": "4"}]},
    {"messages": [{"role": "user", "content": "Tell me a long story."},
                  {"role": "assistant", "content": "Once upon a time " + "there was a story that went on and on, "
                                                   * 12 + "the end."}]},
    {"messages": [{"role": "system", "content": "Nobody answers here."},
                  {"role": "user", "content": "Hello?"}]},
    {"messages": [{"role": "user", "content": "Say yes."},
                  {"role": "assistant", "content": "Yes."}]},
]

# Meta's Llama 3 Instruct template, as its tokenizer_config.json holds it.
LLAMA3_STOCK = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# A Qwen2.5-style template (tools, a default system prompt, tool calls and responses).
QWEN_STOCK = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# ctitan's built-in templates (core/tokenizer/chat.c), word for word.
BUILTIN_LLAMA3 = """{{- bos_token }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {%- if message['role'] == 'assistant' %}
        {%- generation %}
        {{- message['content'] | trim + '<|eot_id|>' }}
        {%- endgeneration %}
    {%- else %}
        {{- message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
BUILTIN_CHATML = """{%- for message in messages %}
    {{- '<|im_start|>' + message['role'] + '\\n' }}
    {%- if message['role'] == 'assistant' %}
        {%- generation %}
        {{- message['content'] + '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
    {%- else %}
        {{- message['content'] + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

QWEN_RENAMES = [("<|reserved_special_token_3|>", "<|im_start|>"), ("<|reserved_special_token_4|>", "<|im_end|>"),
                ("<|reserved_special_token_5|>", "<|endoftext|>")]


def qwen_tokenizer_json():
    text = open(BASE_TOKENIZER, encoding="utf-8").read()
    for a, b in QWEN_RENAMES:
        assert text.count(a) == 1, a
        text = text.replace(a, b)
    return text


def messages_of(conv):
    if "messages" in conv:
        return conv["messages"]
    part = lambda v, role: [{"role": role, "content": v}] if isinstance(v, str) else v
    return part(conv["prompt"], "user") + part(conv["completion"], "assistant")


def encode_tagged(tok, template, msgs):
    out = tok.apply_chat_template(msgs, chat_template=template, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def encode_prefix_rule(tok, template, msgs):
    render = lambda m, gen: tok.apply_chat_template(m, chat_template=template, tokenize=False,
                                                    add_generation_prompt=gen)
    full = render(msgs, False)
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(tok.apply_chat_template(msgs, chat_template=template, tokenize=True, return_dict=True)["input_ids"])
    assert ids == enc["input_ids"]
    mask = [0] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        p, q = render(msgs[:i], True), render(msgs[:i + 1], False)
        assert full.startswith(q) and q.startswith(p)
        a, b = len(p), len(q.rstrip(" \t\r\n"))
        for k, (s, e) in enumerate(enc["offset_mapping"]):
            if s < b and e > a:
                mask[k] = 1
    return ids, mask


def pack(encoded, eos):
    blocks, used = [], []
    stats = {"packed": 0, "too_long": 0, "no_assistant": 0, "counted": 0}
    for ids, mask in encoded:
        if len(ids) > SEQ:
            stats["too_long"] += 1
            continue
        if not any(mask[1:]):
            stats["no_assistant"] += 1
            continue
        b = next((k for k in range(len(blocks)) if SEQ - used[k] >= len(ids)), None)
        if b is None:
            blocks.append([]), used.append(0)
            b = len(blocks) - 1
        words = [t | (MASKED if i == 0 or not mask[i] else 0) | (DOC_START if i == 0 else 0)
                 for i, t in enumerate(ids)]
        stats["counted"] += sum(1 for w in words if not w & MASKED)
        blocks[b] += words
        used[b] += len(ids)
        if used[b] < SEQ:
            blocks[b].append(eos | MASKED)
            used[b] += 1
        stats["packed"] += 1
    words = []
    for blk in blocks:
        words += blk + [eos | MASKED] * (SEQ - len(blk))
    words.append(eos | MASKED)
    stats["sequences"] = len(blocks)
    stats["tokens"] = len(words)
    return words, stats


def shard_bytes(words):
    body = struct.pack("<%dI" % len(words), *words)
    return b"CTTOKENS" + struct.pack("<IIQQ", 4, 4, len(words), zlib.crc32(body)) + body


# Jinja snippets, one construct or two each, rendered by transformers' environment into renders.json
# (tests/unit/test_jinja.c renders them with ctitan's interpreter and compares the text).
SNIPPETS = [
    "{{ 'a' + 'b' ~ 1 ~ none ~ true }}", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 1 / 4 }} {{ 2 * 3 }}",
    "{{ 2.5 * 2 }} {{ 0.1 + 0.2 }} {{ 1e3 if false else 10 / 4 }} {{ -(3) }} {{ 3 - 5 }}",
    "{{ [1, 'a', none, true, 2.5] }} {{ {'k': 'v', 'n': [1]} }}",
    "{{ 1 == 1.0 }} {{ 'b' > 'a' }} {{ 2 <= 1 }} {{ [1, 2] == [1, 2] }} {{ 'x' != 'y' }}",
    "{{ 'ab' in 'cabd' }} {{ 3 not in [1, 2] }} {{ 'role' in messages[0] }} {{ 'zz' in messages[0] }}",
    "{{ x is defined }} {{ messages is defined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }}",
    "{{ 3 is odd }} {{ 4 is even }} {{ true is boolean }} {{ false is false }} {{ 1 is integer }} {{ 1.5 is float }}",
    "{{ messages[0] is mapping }} {{ messages is sequence }} {{ 'a' is iterable }} {{ 2 is equalto 2 }}",
    "{{ x is not defined and not false }} {{ not (1 and 0) or 'fallback' }} {{ 0 or '' or 'last' }}",
    "{{ messages | length }} {{ 'héllo' | length }} {{ messages[0] | length }} {{ [] | length }}",
    "{{ '  hé \\n ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'ab' | upper }}|{{ 'AB' | lower }}",
    "{{ 'hello world' | title }} {{ 'hello' | capitalize }} {{ ['a', 'b', 3] | join('-') }} {{ 'abc' | list }}",
    "{{ [3, 1] | first }} {{ [3, 1] | last }} {{ 'xyz' | first }} {{ undefined_name | default('dflt') }}",
    "{{ '' | default('e', true) }} {{ 'v' | d('w') }} {{ 42 | string }} {{ '7' | int + 1 }} {{ '2.5' | float }}",
    "{{ -3 | abs }} {{ 'a-b-c' | replace('-', '+') }} {{ [1, 2, 3, 4] | select('odd') | list }}",
    "{{ ['a', 'b', 'a'] | reject('equalto', 'a') | list }} {{ {'b': 1, 'a': 2} | items | list }}",
    "{{ messages[0] | tojson }}", "{{ {'k': [1, 2.5, none, true, 'é\\n\\t\\\"'], 'e': {}} | tojson(indent=2) }}",
    "{{ 'é' | tojson }} {{ 'é' | tojson(ensure_ascii=true) }} {{ [] | tojson }} {{ {} | tojson(indent=4) }}",
    "{{ '  a  '.strip() }}|{{ '\\n\\na\\n'.lstrip('\\n') }}|{{ 'a\\n\\n'.rstrip('\\n') }}|{{ 'xa'.lstrip('x') }}",
    "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.endswith('x') }}",
    "{{ 'a,b,,c'.split(',') }} {{ '  x  y '.split() }} {{ 'a b c'.split(' ', 1) }} "
    "{{ 'x</think>y'.split('</think>')[-1] }}",
    "{{ 'Ab'.upper() }} {{ 'Ab'.lower() }} {{ 'ab ab'.replace('a', 'x') }} {{ 'ab cd'.title() }}",
    "{{ messages[0].get('role') }} {{ messages[0].get('nope', 'dflt') }} {{ messages[0].keys() | list }}",
    "{{ messages[-1].content }} {{ messages[1:] | length }} {{ messages[::-1][0].role }} {{ 'abcdef'[1:4] }}",
    "{{ 'abcdef'[::2] }} {{ 'abcdef'[-2:] }} {{ [1, 2, 3][::-1] }} {{ [1, 2, 3][5] is defined }} {{ 'héllo'[1] }}",
    "{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ m.role }}"
    "{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %} {% endfor %}",
    "{% for m in messages %}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.index0 }}"
    "{{ loop.previtem.role if loop.previtem is defined else '-' }} {% endfor %}",
    "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{{ m.role }}"
    "{% if loop.index == 3 %}{% break %}{% endif %},{% endfor %}",
    "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{% set ns.s = ns.s ~ m.role[0] %}"
    "{% endfor %}{{ ns.n }} {{ ns.s }}",
    "{% set x = 1 %}{% for m in messages %}{% set x = 2 %}{% endfor %}{{ x }}",
    "{% if false %}a{% elif none %}b{% elif messages %}c{% else %}d{% endif %}",
    "{% for i in range(3) %}{{ i }}{% endfor %} {% for i in range(1, 7, 2) %}{{ i }}{% endfor %}",
    "{{ 'y' if messages else 'n' }} {{ 'y' if [] else 'n' }} {{ ('a' if false) is defined }}",
    "line1\n  {% if true %}\n    indented\n  {% endif %}\nline2\n",
    "a  {%- if true -%}  b  {%- endif -%}  c\n{# comment #}\n  {#- trimmed -#}  d {{- ' e ' -}} f",
    "  {%+ if true %}plus{% endif +%}\nafter\n",
    "{% for k, v in messages[0] | items %}{{ k }}={{ v }};{% endfor %} "
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}",
    "{% for a, b in [[1, 2, 3]] %}{% endfor %}",
    "{{ 'adjacent' 'strings' }} {{ \"dq\" ~ 'sq' }} {{ 'it\\'s' }}",
    "{{ bos_token }}{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}|{% endfor %}",
    "{{ raise_exception('stop here') }}",
    "{{ missing.attr }}",
    "{{ 1 + 'a' }}",
]

SNIPPET_VARS = {"messages": [{"role": "system", "content": "  Be brief.  "},
                             {"role": "user", "content": "Hi \u00e9 \u2713"},
                             {"role": "assistant", "content": "Hello!\n"}],
                "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": False, "tools": None}


def renders():
    """Every snippet and every corpus template (tests/fuzz/corpus/jinja) with two conversations."""
    from transformers.utils.chat_template_utils import _compile_jinja_template
    corpus = os.path.join(ROOT, "tests/fuzz/corpus/jinja")
    full = dict(SNIPPET_VARS, messages=[
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "Hi \u2014 \u00fcn\u00efcode \U0001F600"},
        {"role": "assistant", "content": "Hello!\n"}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"}])
    tools = dict(SNIPPET_VARS, add_generation_prompt=True, enable_thinking=False, messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Z\u00fcrich", "n": 2}}}]},
        {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "22C"},
        {"role": "assistant", "content": "Sunny, 22C."}],
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])
    builtin = dict(SNIPPET_VARS, builtin_tools=["brave_search", "code_interpreter"], tools_in_user_message=False,
                   messages=[{"role": "system", "content": "Sys"}, {"role": "user", "content": "Weather?"},
                             {"role": "assistant", "tool_calls": [{"type": "function", "function": {
                                 "name": "brave_search", "arguments": {"query": "Z\u00fcrich"}}}]},
                             {"role": "ipython", "content": {"temp": 22}}, {"role": "assistant", "content": "22C."}])
    cases = [("snippet %d" % i, t, SNIPPET_VARS) for i, t in enumerate(SNIPPETS)]
    for name in sorted(os.listdir(corpus)):
        src = open(os.path.join(corpus, name), encoding="utf-8").read()
        cases += [(name + " full", src, full), (name + " tools", src, tools),
                  (name + " builtin tools", src, builtin)]
    out = []
    for name, src, v in cases:
        if name.startswith("bad_"):  # Jinja that the subset leaves out: ctitan refuses it
            out.append({"name": name, "template": src, "vars": v, "error": "outside the subset"})
            continue
        try:
            text = _compile_jinja_template(src).render(**v)
            out.append({"name": name, "template": src, "vars": v, "output": text})
        except Exception as e:  # a refusal ctitan must make too (any one-line message)
            out.append({"name": name, "template": src, "vars": v, "error": type(e).__name__})
    with open(os.path.join(OUT, "renders.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("renders.json: %d cases, %d errors" % (len(out), sum("error" in c for c in out)))


# `ctitan generate --chat` wraps its prompt as one user message plus the generation prompt
# (tests/cli/generate_chat.sh): transformers' ids for it, per case, in generation_prompts.txt.
GENERATION_PROMPTS = ["What is the capital of France?", "Traduis « bonjour » en allemand.", "日本の首都は？ 🗼"]


def generation_prompts(cases, toks):
    with open(os.path.join(OUT, "generation_prompts.txt"), "w", encoding="utf-8") as f:
        f.write("# case prompt-index: transformers' apply_chat_template([user], add_generation_prompt=True) ids\n")
        for i, p in enumerate(GENERATION_PROMPTS):
            f.write("prompt %d %s\n" % (i, p))
        for case, folder, template, _ in cases:
            for i, p in enumerate(GENERATION_PROMPTS):
                ids = toks[folder].apply_chat_template([{"role": "user", "content": p}], chat_template=template,
                                                       tokenize=True, add_generation_prompt=True, return_dict=True)
                f.write("%s %d %s\n" % (case, i, " ".join(map(str, ids["input_ids"]))))


def main():
    os.makedirs(os.path.join(OUT, "llama3"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "qwen"), exist_ok=True)
    with open(os.path.join(OUT, "conversations.jsonl"), "w", encoding="utf-8") as f:
        for c in CONVERSATIONS:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    configs = {
        "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "chat_template": LLAMA3_STOCK,
                   "tokenizer_class": "PreTrainedTokenizerFast"},
        "qwen": {"bos_token": None, "eos_token": "<|im_end|>", "chat_template": QWEN_STOCK,
                 "tokenizer_class": "PreTrainedTokenizerFast"},
    }
    for name, cfg in configs.items():
        with open(os.path.join(OUT, name, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2, ensure_ascii=False)
            f.write("\n")
    tmp = tempfile.mkdtemp()
    try:
        toks = {}
        for name in configs:
            d = os.path.join(tmp, name)
            os.makedirs(d)
            shutil.copy(os.path.join(OUT, name, "tokenizer_config.json"), d)
            with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
                f.write(qwen_tokenizer_json() if name == "qwen" else open(BASE_TOKENIZER, encoding="utf-8").read())
            toks[name] = AutoTokenizer.from_pretrained(d)
        cases = [("llama3_config", "llama3", LLAMA3_STOCK, encode_prefix_rule),
                 ("llama3_builtin", "llama3", BUILTIN_LLAMA3, encode_tagged),
                 ("qwen_config", "qwen", QWEN_STOCK, encode_prefix_rule),
                 ("chatml_builtin", "qwen", BUILTIN_CHATML, encode_tagged)]
        results = {}
        for case, folder, template, encode in cases:
            tok = toks[folder]
            encoded = [encode(tok, template, messages_of(c)) for c in CONVERSATIONS]
            results[case] = encoded
            words, stats = pack(encoded, tok.convert_tokens_to_ids(tok.eos_token))
            with open(os.path.join(OUT, case + ".bin"), "wb") as f:
                f.write(shard_bytes(words))
            with open(os.path.join(OUT, case + ".txt"), "w") as f:
                f.write("# %s: %s\n" % (case, json.dumps(stats)))
                for n, (ids, mask) in enumerate(encoded, 1):
                    f.write("line %d ids %s\nline %d mask %s\n" % (n, " ".join(map(str, ids)), n,
                                                                  "".join(map(str, mask))))
            print(case, stats)
        # the rule and transformers' generation masks agree where the renders are the same text
        for stock, tagged in (("llama3_config", "llama3_builtin"),):
            for (i1, m1), (i2, m2) in zip(results[stock], results[tagged]):
                assert i1 == i2 and m1 == m2, (stock, tagged)
        for (i1, m1), (i2, m2), c in zip(results["qwen_config"], results["chatml_builtin"], CONVERSATIONS):
            # the Qwen template adds a default system prompt: compare from the first assistant token on
            if messages_of(c)[0]["role"] == "system":
                assert i1 == i2 and m1 == m2, "qwen_config vs chatml_builtin"
        generation_prompts(cases, toks)
    finally:
        shutil.rmtree(tmp)
    renders()


if __name__ == "__main__":
    sys.exit(main())
