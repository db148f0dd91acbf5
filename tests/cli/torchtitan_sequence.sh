#!/usr/bin/env bash
# torchtitan_sequence: commands in the order a torchtitan user runs them, written its way (--job.config_file,
# its TOML, bare boolean flags, `launch -n N` for torchrun's ranks), each reading what the one before wrote:
#   1. train on 2 ranks (FSDP 2) with a checkpoint and the final Hugging Face export (last_save_in_hf);
#   2. fine-tune from that export by the path torchtitan's next command gives, the step folder itself
#      (.../step-4 with initial_load_in_hf: ctitan finds step-4-hf beside it);
#   3. a pipeline schedule from a CSV with two stages per rank (PipelineScheduleMulti, stages from the file);
#   4. generate from the first run's checkpoint, on the same config.
set -u
. tests/cli/lib/common.sh
CTITAN=${CTITAN:-build/ctitan}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
tt=configs/torchtitan/llama3_debugmodel.toml
corpus=tests/data/tokenizer/corpus.txt
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 512 --output "$T/tok.model" >/dev/null || fail "tokenizer"
"$CTITAN" tokenize --tokenizer "$T/tok.model" --input "$corpus" --output "$T/data.bin" >/dev/null || fail "tokenize"
small=(--training.seq_len=32 --training.local_batch_size=2 --training.dataset_path="$T/data.bin" --device.threads=1
       --model.vocab_size=512 --model.tokenizer_path="$T/tok.model" --comm.train_timeout_seconds=120)

# 1. train with the export
"$CTITAN" launch -n 2 train --job.config_file "$tt" "${small[@]}" --training.steps 4 --job.dump_folder "$T/run" \
  --parallelism.data_parallel_shard_degree 2 --checkpoint.enable --checkpoint.interval 4 --checkpoint.last_save_in_hf \
  >"$T/1.log" 2>&1 || { tail -5 "$T/1.log"; fail "1. training with last_save_in_hf"; }
[ -f "$T/run/checkpoint/step-4/metadata.json" ] && [ -f "$T/run/checkpoint/step-4-hf/model.safetensors" ] ||
  fail "1. step-4 and step-4-hf were not both written"
echo "ok   1. FSDP 2 trains 4 steps, checkpoints step-4 and exports step-4-hf"

# 2. the next command loads the step folder's path as Hugging Face
"$CTITAN" train --job.config_file "$tt" "${small[@]}" --training.steps 2 --job.dump_folder "$T/ft" \
  --checkpoint.enable --checkpoint.initial_load_path "$T/run/checkpoint/step-4" --checkpoint.initial_load_in_hf \
  >"$T/2.log" 2>&1 || { tail -5 "$T/2.log"; fail "2. fine-tuning from the export"; }
grep -q "loaded the Hugging Face model" "$T/2.log" && grep -q "step-4-hf" "$T/2.log" ||
  { grep -i "hugging\|step-4" "$T/2.log" | head -3; fail "2. the run did not load step-4-hf"; }
echo "ok   2. initial_load_in_hf on .../step-4 loads the export beside it ($(grep -m1 -o '[^ ]*step-4-hf[^ ]*' "$T/2.log"))"

# 3. a CSV schedule with two stages per rank
row() { local s m out=""; for s in "$@"; do for m in 0 1 2 3; do out+="${out:+,}$s"; out+="$m"; done; done; echo "$out"; }
{ row 0F 2F 2B 0B; row 1F 3F 3B 1B; } >"$T/custom_schedule.csv"
"$CTITAN" launch -n 2 train --job.config_file "$tt" "${small[@]}" --training.steps 2 --job.dump_folder "$T/pp" \
  --training.local_batch_size 4 --parallelism.pipeline_parallel_degree 2 \
  --parallelism.pipeline_parallel_schedule PipelineScheduleMulti \
  --parallelism.pipeline_parallel_schedule_csv "$T/custom_schedule.csv" --parallelism.pipeline_parallel_microbatch_size 1 \
  >"$T/3.log" 2>&1 || { tail -5 "$T/3.log"; fail "3. the CSV schedule"; }
grep -q "4 stages on 2 ranks (2 per rank)" "$T/3.log" || { grep -i stage "$T/3.log" | head -3; fail "3. stages"; }
echo "ok   3. PipelineScheduleMulti from a CSV runs 4 stages on 2 ranks"

# 4. generate on the same config from the first run
"$CTITAN" generate --job.config_file "$tt" "${small[@]}" --job.dump_folder "$T/run" --prompt "the" \
  --generate.max_new_tokens 4 >"$T/4.log" 2>&1 || { tail -5 "$T/4.log"; fail "4. generate"; }
echo "ok   4. generate on the config samples from the run ($(tail -1 "$T/4.log" | tr -cd "[:print:]" | cut -c1-60))"
