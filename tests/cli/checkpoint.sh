#!/usr/bin/env bash
# Checkpoints: exact resume (single rank and FSDP 2: bit-identical losses and grad norms), resharding
# (saved under FSDP 4, continued under one rank, FSDP 2, HSDP 2x2 and DDP 2 within 1e-6), async
# saves, keep_latest_k, generation from a checkpoint, and crash safety (a process killed at random
# points of its saves 20 times; every time the newest complete checkpoint loads and training goes on).
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
. tests/cli/lib/curves.sh
corpus=tests/data/tokenizer/corpus.txt
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 512 --output "$T/tok.model" >/dev/null || fail tokenizer
"$CTITAN" tokenize --tokenizer "$T/tok.model" --input "$corpus" --output "$T/data.bin" >/dev/null || fail tokenize
base=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --model.vocab_size=512 --model.n_layers=2
      --model.dim=128 --model.n_heads=4 --model.n_kv_heads=2 --training.seq_len=32 --training.global_batch_size=8
      --training.steps=20 --metrics.log_freq=1 --generate.max_new_tokens=0 --activation_checkpoint.mode=none
      --checkpoint.enable=true --checkpoint.interval=10 --device.threads=1 --lr_scheduler.warmup_steps=3)
run() { # name ranks args...
  local name=$1 n=$2; shift 2
  if [ "$n" -eq 1 ]; then "$CTITAN" train "${base[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1
  else "$CTITAN" launch -n "$n" train "${base[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1; fi \
    || { tail -20 "$T/$name.log"; fail "$name run"; }
}
resume_from() { # name source-run
  mkdir -p "$T/$1/checkpoint" && cp -r "$T/$2/checkpoint/step-10" "$T/$1/checkpoint/"
}
losses() { grep '"loss"' "$T/$1/metrics.jsonl" | cut -d, -f1-3; } # step, loss, grad_norm as printed (9 digits)
# exact resume, one rank and FSDP 2
run single 1 --training.local_batch_size=8
resume_from single_resumed single
run single_resumed 1 --training.local_batch_size=8
grep -q "resuming after step 10" "$T/single_resumed.log" || fail "single: did not resume"
cmp -s <(losses single | sed -n 11,20p) <(losses single_resumed) || fail "single: resumed losses differ"
echo "ok   exact resume, one rank: steps 11-20 bit-identical"
fsdp2=(--training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2)
run fsdp2 2 "${fsdp2[@]}"
resume_from fsdp2_resumed fsdp2
run fsdp2_resumed 2 "${fsdp2[@]}"
cmp -s <(losses fsdp2 | sed -n 11,20p) <(losses fsdp2_resumed) || fail "FSDP 2: resumed losses differ"
echo "ok   exact resume, FSDP 2: steps 11-20 bit-identical"
# async saves give the same checkpoint contents
run async 1 --training.local_batch_size=8 --checkpoint.async_mode=async
for f in "$T"/single/checkpoint/step-10/rank-*.bin; do cmp -s "$f" "$T/async/checkpoint/step-10/$(basename "$f")" || fail "async save differs"; done
echo "ok   async save: step-10 files identical to the synchronous save"
# resharding: FSDP 4's step-10 continued under other layouts
run fsdp4 4 --training.local_batch_size=2 --parallelism.data_parallel_shard_degree=4
close() { same_curve "resharded FSDP 4 -> $1" "$T/fsdp4/metrics.jsonl" "$T/$1/metrics.jsonl" 10 11; }
resume_from to_single fsdp4; run to_single 1 --training.local_batch_size=8; close to_single || exit 1
resume_from to_fsdp2 fsdp4; run to_fsdp2 2 "${fsdp2[@]}"; close to_fsdp2 || exit 1
resume_from to_hsdp fsdp4; run to_hsdp 4 --training.local_batch_size=2 --parallelism.data_parallel_replicate_degree=2 \
  --parallelism.data_parallel_shard_degree=2; close to_hsdp || exit 1
resume_from to_ddp fsdp4; run to_ddp 2 --training.local_batch_size=4 --parallelism.data_parallel_replicate_degree=2 \
  --parallelism.data_parallel_shard_degree=1; close to_ddp || exit 1
# keep_latest_k and the final model-only save
run keep 1 --training.local_batch_size=8 --checkpoint.interval=2 --checkpoint.keep_latest_k=3
[ "$(ls "$T/keep/checkpoint" | tr '\n' ' ')" = "step-16 step-18 step-20 " ] || fail "keep_latest_k 3 left: $(ls "$T/keep/checkpoint")"
grep -q '"optimizer.0' "$T/keep/checkpoint/step-20/metadata.json" && fail "the final save should be model-only"
echo "ok   keep_latest_k 3 keeps step-16, -18, -20; the final save is model-only"
# generation from any checkpoint (here the FSDP 4 one, on one rank)
"$CTITAN" generate "${base[@]}" --model.tokenizer_path="$T/tok.model" --job.dump_folder="$T/gen" \
  --checkpoint "$T/fsdp4/checkpoint/step-10" --prompt "The" --generate.top_p=0.9 >"$T/gen.log" 2>&1 \
  || { cat "$T/gen.log"; fail "generate from a checkpoint"; }
echo "ok   generate from FSDP 4's step-10 on one rank: $(head -c 60 "$T/gen.log" | tr '\n' ' ')"
# exclude_from_loading: the optimizer starts fresh (moments zero), so the continued curve changes
resume_from no_opt single
run no_opt 1 --training.local_batch_size=8 --checkpoint.exclude_from_loading=optimizer
grep -q "resuming after step 10" "$T/no_opt.log" && grep -q "(model, train state)" "$T/no_opt.log" || fail "exclude optimizer"
cmp -s <(losses single | sed -n 11,20p) <(losses no_opt) && fail "excluding the optimizer changed nothing"
[ "$(losses no_opt | head -1 | cut -d, -f2)" = "$(losses single | sed -n 11p | cut -d, -f2)" ] || fail "step 11's loss must not depend on the optimizer"
echo "ok   exclude_from_loading=optimizer: same step-11 loss, a different curve after"
# create_seed_checkpoint: step-0 with the model only, then a run starting from it
run seed 1 --checkpoint.create_seed_checkpoint=true
[ -f "$T/seed/checkpoint/step-0/metadata.json" ] && ! grep -q optimizer "$T/seed/checkpoint/step-0/metadata.json" || fail "seed checkpoint"
[ ! -f "$T/seed/metrics.jsonl" ] || fail "a seed checkpoint run must not train"
run from_seed 1 --training.local_batch_size=8 --training.steps=2 --checkpoint.initial_load_path="$T/seed/checkpoint"
[ "$(losses from_seed | head -1)" = "$(losses single | head -1)" ] || fail "starting from the seed checkpoint changed step 1"
echo "ok   create_seed_checkpoint writes step-0 (model only); a run from it matches the fresh run's step 1"
# Hugging Face inside a run: the final model written as an HF folder, then a new run starting from it
run hf_out 1 --training.local_batch_size=8 --training.steps=5 --checkpoint.last_save_in_hf=true
[ -f "$T/hf_out/checkpoint/step-5-hf/config.json" ] && [ -f "$T/hf_out/checkpoint/step-5-hf/model.safetensors" ] || fail "no HF export"
run from_hf 1 --training.local_batch_size=8 --training.steps=2 --checkpoint.initial_load_path="$T/hf_out/checkpoint/step-5-hf" \
  --checkpoint.initial_load_in_hf=true --checkpoint.enable=false
run from_ckpt 1 --training.local_batch_size=8 --training.steps=2 --checkpoint.initial_load_path="$T/hf_out/checkpoint/step-5" \
  --checkpoint.enable=false
cmp -s <(losses from_hf) <(losses from_ckpt) || fail "the HF export does not hold the same model as the checkpoint"
echo "ok   last_save_in_hf + initial_load_in_hf: the HF folder continues exactly like the step-5 checkpoint"
# torchtitan's next command names the step's own folder with initial_load_in_hf: the export beside it
run from_step 1 --training.local_batch_size=8 --training.steps=2 --checkpoint.initial_load_path="$T/hf_out/checkpoint/step-5/" \
  --checkpoint.initial_load_in_hf=true --checkpoint.enable=false
grep -q "step-5/ holds no config.json: loading the Hugging Face export beside it, .*step-5-hf" "$T/from_step.log" ||
  fail "initial_load_in_hf on step-5/: no notice of the export beside it"
cmp -s <(losses from_hf) <(losses from_step) || fail "initial_load_in_hf on step-5/ did not load step-5-hf"
echo "ok   initial_load_in_hf on .../step-5/ (torchtitan's path) loads the export beside it, step-5-hf"
# crash safety: kill -9 at random points while saving every step
crash=(--training.local_batch_size=8 --training.steps=100000 --checkpoint.interval=1 --checkpoint.keep_latest_k=2
       --checkpoint.last_save_model_only=false
       --model.dim=256 --model.n_heads=8 --model.n_kv_heads=4 --job.dump_folder="$T/crash")
resumed=0; midsave=0
for i in $(seq 20); do
  "$CTITAN" train "${base[@]}" "${crash[@]}" >"$T/crash.log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do # until this run has saved once (the first time there is nothing to resume from)
    [ "$(ls "$T/crash/checkpoint" 2>/dev/null | grep -cE '^step-[0-9]+$')" -gt 0 ] && break; sleep 0.05; done
  if [ $((i % 2)) -eq 0 ]; then # every other kill lands inside a save: as soon as its .tmp folder appears
    for _ in $(seq 400); do ls "$T/crash/checkpoint" 2>/dev/null | grep -q '\.tmp$' && break; sleep 0.01; done
    sleep "0.0$(( RANDOM % 3 ))"
  else
    sleep "0.$(( RANDOM % 10 ))$(( RANDOM % 10 ))"
  fi
  kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
  ls "$T/crash/checkpoint" 2>/dev/null | grep -q '\.tmp$' && midsave=$((midsave + 1))
  latest=$(ls "$T/crash/checkpoint" 2>/dev/null | grep -E '^step-[0-9]+$' | sed 's/step-//' | sort -n | tail -1)
  [ -n "$latest" ] || continue
  "$CTITAN" train "${base[@]}" "${crash[@]}" --training.steps=$((latest + 1)) >"$T/crash_resume.log" 2>&1 \
    || { cat "$T/crash_resume.log"; fail "kill $i: cannot resume from step-$latest"; }
  grep -q "resuming after step $latest\$" "$T/crash_resume.log" || { cat "$T/crash_resume.log"; fail "kill $i: did not load step-$latest"; }
  resumed=$((resumed + 1))
done
[ $resumed -eq 20 ] || fail "only $resumed of 20 kills left a checkpoint to resume from"
[ $midsave -ge 8 ] || fail "only $midsave kills landed inside a save"
echo "ok   crash safety: $resumed of 20 random kills resumed from the newest complete checkpoint ($midsave interrupted a save mid-way)"
