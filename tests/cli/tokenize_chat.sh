#!/usr/bin/env bash
# ctitan tokenize --format chat against transformers (tests/golden/gen_chat_golden.py):
# - twelve conversations (system prompts, multi-turn, prompt/completion pairs as strings and as message
#   lists, unicode, one longer than a sequence, one without an assistant turn) rendered with a Llama 3
#   template and a Qwen2.5-style template from the model folders' tokenizer_config.json, and with the
#   built-in llama3 and chatml templates, give the golden shards word for word: transformers'
#   apply_chat_template ids, the assistant-token masks, first-fit packing into sequences of 128 with
#   EOS between conversations, and the summary's counts;
# - refusals, each one line and status 2: an unsupported Jinja construct, an unknown filter (both with
#   their line and column), a line that is not a conversation, a message without a role, an exception
#   the template raises, a template that renders earlier turns differently once more follow (Qwen3's
#   reasoning blocks), a folder whose tokenizer_config.json has no chat_template, and the options that
#   belong to the chat format alone.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
counting_fails
test_tmp
G=tests/golden/chat
base=tests/data/tokenizer/hf/llama3/tokenizer.json
mkdir -p "$T/llama3" "$T/qwen"
cp "$base" "$G/llama3/tokenizer_config.json" "$T/llama3/"
# the Qwen folder's tokenizer.json: three reserved specials renamed, as the generator does
sed -e 's/<|reserved_special_token_3|>/<|im_start|>/' -e 's/<|reserved_special_token_4|>/<|im_end|>/' \
    -e 's/<|reserved_special_token_5|>/<|endoftext|>/' "$base" >"$T/qwen/tokenizer.json"
cp "$G/qwen/tokenizer_config.json" "$T/qwen/"

for c in llama3_config:llama3: llama3_builtin:llama3:llama3 qwen_config:qwen: chatml_builtin:qwen:chatml; do
  IFS=: read -r case dir tpl <<<"$c"
  if ! "$CTITAN" tokenize --format chat --tokenizer "$T/$dir" ${tpl:+--chat-template "$tpl"} --seq-len 128 \
       --input "$G/conversations.jsonl" --output "$T/$case.bin" >"$T/$case.log" 2>&1; then
    cat "$T/$case.log"; fail "$case: tokenize"; continue
  fi
  if cmp -s "$T/$case.bin" "$G/$case.bin"; then
    echo "ok   $case: $(wc -c <"$G/$case.bin") bytes equal to the golden shard"
  else
    at=$(cmp "$T/$case.bin" "$G/$case.bin" | sed 's/.*byte \([0-9]*\),.*/\1/')
    fail "$case: differs from $G/$case.bin at byte $at (word $(( (at - 33) / 4 )); see $G/$case.txt)"
  fi
  # the counts the golden's header line gives, as the summary must say them
  want=$(sed -n '1s/^# [a-z0-9_]*: //p' "$G/$case.txt" | python3 -c 'import json, sys
s = json.load(sys.stdin)
print("%(packed)d packed into %(sequences)d sequences of 128, %(too_long)d dropped longer than --seq-len, "
      "%(no_assistant)d dropped without assistant tokens; %(tokens)d tokens: %(counted)d kept in the loss" % s)')
  grep -qF "12 conversations" "$T/$case.log" && grep -qF "$want" "$T/$case.log" &&
    echo "ok   $case: $want" || { cat "$T/$case.log"; fail "$case: the summary does not say: $want"; }
  # version 4 records each conversation's start (the Qwen folder's EOS, <|im_end|>, also ends every
  # turn, so the EOS cannot tell block_causal where a conversation starts): one start per packed one
  if "$CTITAN" tokenize --check "$T/$case.bin" 2>&1 | grep -qF "version 4, 513 tokens, 10 documents started" ||
     "$CTITAN" tokenize --check "$T/$case.bin" 2>&1 | grep -qF "version 4, 641 tokens, 10 documents started"; then
    echo "ok   $case: --check: version 4, 10 documents started"
  else
    "$CTITAN" tokenize --check "$T/$case.bin"; fail "$case: --check does not say version 4 with 10 documents started"
  fi
done

refused() { # name expected-message command...
  local name=$1 want=$2; shift 2
  "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qF -- "$want" "$T/err"; then
    echo "ok   $name: $(cat "$T/err")"
  else
    cat "$T/err"; fail "$name: status $rc, expected 2 and one line saying: $want"
  fi
}
chat=("$CTITAN" tokenize --format chat --seq-len 128 --output "$T/x.bin")
printf '{{ bos_token }}\n{%% macro turn(m) %%}{{ m }}{%% endmacro %%}\n' >"$T/macro.jinja"
refused "a macro" "macro.jinja:2:4: unsupported statement 'macro'" \
  "${chat[@]}" --tokenizer "$T/llama3" --chat-template "$T/macro.jinja" --input "$G/conversations.jsonl"
printf '{%%- for m in messages %%}\n  {{- m.content | wordcount }}\n{%%- endfor %%}\n' >"$T/filter.jinja"
refused "an unknown filter" "filter.jinja:2:19: unsupported filter 'wordcount'" \
  "${chat[@]}" --tokenizer "$T/llama3" --chat-template "$T/filter.jinja" --input "$G/conversations.jsonl"
printf '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n{"text": "hi"}\n' \
  >"$T/notconv.jsonl"
refused "not a conversation" \
  "notconv.jsonl:2: not a conversation: expected {\"messages\": [...]} or {\"prompt\": ..., \"completion\": ...}" \
  "${chat[@]}" --tokenizer "$T/llama3" --input "$T/notconv.jsonl"
printf '{"messages": [{"role": "user", "content": "a"}, {"content": "b"}]}\n' >"$T/norole.jsonl"
refused "a missing role" "norole.jsonl:1: messages[1]: no \"role\"" \
  "${chat[@]}" --tokenizer "$T/llama3" --input "$T/norole.jsonl"
printf '%s' '{%- for m in messages %}{%- if m.role == "tool" %}{{ raise_exception("no tools here") }}' \
  '{%- endif %}{{ m.content }}{%- endfor %}' >"$T/raise.jinja"
printf '{"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]}\n' >"$T/tool.jsonl"
refused "raise_exception" "tool.jsonl:1: $T/raise.jinja:1:54: the template raised an exception: no tools here" \
  "${chat[@]}" --tokenizer "$T/llama3" --chat-template "$T/raise.jinja" --input "$T/tool.jsonl"
# Qwen3's template drops an earlier turn's reasoning once a later user turn follows
cat >"$T/qwen3.jinja" <<'JINJA'
{%- set ns = namespace(last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- if message.role == "user" and ns.last_query_index == messages|length - 1 %}
        {%- set ns.last_query_index = (messages|length - 1) - loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "assistant" and loop.index0 > ns.last_query_index %}
        {{- '<|im_start|>assistant\n<think>\n\n</think>\n\n' + message.content + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
JINJA
sed -n 2p "$G/conversations.jsonl" >"$T/multi.jsonl"
refused "a template that renders earlier turns differently" \
  "multi.jsonl:1: messages[1] (assistant): the template renders the conversation up to it differently once more follows" \
  "${chat[@]}" --tokenizer "$T/qwen" --chat-template "$T/qwen3.jinja" --input "$T/multi.jsonl"
sed -n 1p "$G/conversations.jsonl" >"$T/single.jsonl"
"${chat[@]/$T\/x.bin/$T/single.bin}" --tokenizer "$T/qwen" --chat-template "$T/qwen3.jinja" \
  --input "$T/single.jsonl" >"$T/out" 2>&1 &&
  grep -qF "1 packed" "$T/out" && echo "ok   the same template on a single-turn conversation: $(cat "$T/out")" ||
  { cat "$T/out"; fail "qwen3 template on one turn"; }
refused "no chat_template" \
  "tokenizer_config.json: chat_template: missing; name a template with --chat-template llama3, chatml or a file" \
  "${chat[@]}" --tokenizer tests/data/tokenizer/hf/llama3 --input "$G/conversations.jsonl"
refused "--format chat without --seq-len" "--format chat needs --seq-len N" \
  "$CTITAN" tokenize --format chat --tokenizer "$T/llama3" --input "$G/conversations.jsonl" --output "$T/x.bin"
refused "--chat-template with jsonl" "--chat-template applies to --format chat only" \
  "$CTITAN" tokenize --format jsonl --chat-template llama3 --tokenizer "$T/llama3" --input "$G/conversations.jsonl" \
  --output "$T/x.bin"
[ ! -e "$T/x.bin" ] || fail "a refused run left $T/x.bin"
[ "$fails" -eq 0 ] && echo "tokenize_chat: ok" || { echo "tokenize_chat: $fails failed"; exit 1; }
