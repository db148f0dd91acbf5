#!/usr/bin/env bash
# ctitan generate --chat: the prompt as one user message through a chat template with its generation
# prompt, the reply stopped at the template's end-of-turn token.
# - prompt ids: three prompts (ASCII, French, Japanese with an emoji) through the Llama 3 and the
#   Qwen2.5-style folders' templates (tokenizer_config.json, the default) and the built-in llama3 and
#   chatml templates give transformers' apply_chat_template(..., add_generation_prompt=True) ids
#   (tests/golden/chat/generation_prompts.txt, from tests/golden/gen_chat_golden.py);
# - the stop: a small model trained 40 steps on one conversation (Llama 3's template, whose turns end
#   in <|eot_id|>, a special token that is not the EOS) answers its question with the trained reply
#   alone, ended by <|eot_id|>, though max_new_tokens leaves room for more; without --chat the same
#   model runs on past it;
# - refusals, one line and status 2: a folder whose tokenizer_config.json has no chat_template, a
#   template whose assistant turn ends in plain text, --chat given to `ctitan train`.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
pass() { echo "ok   $*"; }
G=tests/golden/chat
base=tests/data/tokenizer/hf/llama3/tokenizer.json
mkdir -p "$T/llama3" "$T/qwen"
cp "$base" "$G/llama3/tokenizer_config.json" "$T/llama3/"
sed -e 's/<|reserved_special_token_3|>/<|im_start|>/' -e 's/<|reserved_special_token_4|>/<|im_end|>/' \
    -e 's/<|reserved_special_token_5|>/<|endoftext|>/' "$base" >"$T/qwen/tokenizer.json"
cp "$G/qwen/tokenizer_config.json" "$T/qwen/"
q='{"role": "user", "content": "What is the capital of France?"}'
for i in 1 2 3 4 5 6 7 8; do echo "{\"messages\": [$q, {\"role\": \"assistant\", \"content\": \"Paris.\"}]}"; done >"$T/c.jsonl"
"$CTITAN" tokenize --format chat --tokenizer "$T/llama3" --seq-len 64 --input "$T/c.jsonl" --output "$T/c.bin" \
  >"$T/tok.log" 2>&1 || { cat "$T/tok.log"; fail "tokenize"; }
m=(configs/llama3_debug.yaml --model.tokenizer_path="$T/llama3" --training.seq_len=64 --device.threads=1
   --model.n_layers=2 --model.dim=64 --model.n_heads=4 --model.n_kv_heads=2 --model.ffn_hidden=128
   --generate.max_new_tokens=0 --job.dump_folder="$T/run")
"$CTITAN" train "${m[@]}" --training.dataset_path="$T/c.bin" --training.local_batch_size=2 --training.steps=40 \
  --lr_scheduler.warmup_steps=5 --metrics.log_freq=10 >"$T/train.log" 2>&1 || { tail "$T/train.log"; fail "train"; }
gen=("$CTITAN" generate "${m[@]}" --generate.temperature=0 --generate.max_new_tokens=12)
counting_fails # from here every check reports and the test goes on

# the prompt's ids against transformers'
for c in llama3_config:llama3: llama3_builtin:llama3:llama3 qwen_config:qwen: chatml_builtin:qwen:chatml; do
  IFS=: read -r case dir tpl <<<"$c"
  for i in 0 1 2; do
    prompt=$(sed -n "s/^prompt $i //p" "$G/generation_prompts.txt")
    want=$(sed -n "s/^$case $i //p" "$G/generation_prompts.txt")
    got=$("${gen[@]}" --model.tokenizer_path="$T/$dir" --generate.max_new_tokens=1 --prompt "$prompt" --print-prompt-ids \
          ${tpl:+--chat-template "$tpl"} --chat 2>&1 >/dev/null | sed -n 's/^generate: chat prompt ids: [0-9]* tokens: //p')
    [ -n "$want" ] && [ "$got" = "$want" ] && pass "$case prompt $i: $(wc -w <<<"$want") ids equal transformers'" ||
      fail "$case prompt $i: ids '$got', transformers gives '$want'"
  done
done

# the stop at <|eot_id|>
"${gen[@]}" --chat --prompt "What is the capital of France?" >"$T/chat.out" 2>"$T/chat.err" ||
  { cat "$T/chat.err"; fail "generate --chat"; }
[ "$(cat "$T/chat.out")" = "Paris." ] && grep -q "^generate: the reply: [0-9]* tokens, ended by <|eot_id|>$" "$T/chat.err" &&
  pass "the trained reply alone: '$(cat "$T/chat.out")'; $(grep '^generate: the reply' "$T/chat.err")" ||
  { cat "$T/chat.err"; fail "generate --chat printed '$(cat "$T/chat.out")', expected 'Paris.' ended by <|eot_id|>"; }
plain=$("${gen[@]}" --prompt "What is the capital of France?" 2>/dev/null | tail -1)
[ "${plain#What is the capital of France?}" != "Paris." ] && pass "without --chat the sample runs on: '$plain'" ||
  fail "without --chat the sample is '$plain' too: the stop is not what ended the reply"

refused() { # name expected-message command...
  local name=$1 want=$2; shift 2
  "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ $rc -eq 2 ] && [ "$(grep -vc '^generate: ' "$T/err")" -eq 1 ] && grep -qF -- "$want" "$T/err"; then
    pass "$name: $(grep -v '^generate: ' "$T/err")"
  else
    cat "$T/err"; fail "$name: status $rc, expected 2 and one line saying: $want"
  fi
}
mkdir -p "$T/bare" && cp "$base" "$T/bare/" && echo '{"eos_token": "<|end_of_text|>"}' >"$T/bare/tokenizer_config.json"
refused "no chat_template" "tokenizer_config.json" "${gen[@]}" --model.tokenizer_path="$T/bare" --chat
printf '{%% for m in messages %%}{{ m.role }}: {{ m.content }}\n{%% endfor %%}' >"$T/plain.jinja"
refused "no end-of-turn token" "an assistant turn does not end with a special token" \
  "${gen[@]}" --chat-template "$T/plain.jinja"
refused "train --chat" "belong to \`ctitan generate\`" "$CTITAN" train "${m[@]}" --chat
[ "$fails" -eq 0 ] && echo "generate_chat: ok" || { echo "generate_chat: $fails failed"; exit 1; }
