# layouts.sh: sourced by the layout-equivalence tests (fsdp_, tp_, pp_equivalence.sh). Trains a
# tokenizer on the test corpus into $T, and defines:
#   common   the debugmodel fp32 settings every run shares ($STEPS steps, global batch 8 x 64 tokens)
#   narrow   debugmodel at half its width (dim 128, SwiGLU hidden 384; its 6 layers and 16 heads kept):
#            a third of the FLOPs per token, for the tests that train a layout dozens of times
#   run NAME RANKS ARGS...   one run (launched on RANKS ranks when > 1), its log in $T/NAME.log
#   compare REF RUN N        RUN's N losses and grad norms against REF's, within 1e-6 (same_curve)
#   mem RUN                  bytes of parameters + gradients + optimizer states per rank (first step)
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp
. tests/cli/lib/curves.sh
STEPS=${STEPS:-20}
corpus=tests/data/tokenizer/corpus.txt
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 2048 --output "$T/tok.model" >/dev/null || fail "tokenizer"
"$CTITAN" tokenize --tokenizer "$T/tok.model" --input "$corpus" --output "$T/data.bin" >/dev/null || fail "tokenize"
common=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --training.seq_len=64
        --training.global_batch_size=8 --training.steps=$STEPS --metrics.log_freq=1 --generate.max_new_tokens=0
        --training.mixed_precision_param=float32 --activation_checkpoint.mode=none --lr_scheduler.warmup_steps=5
        --device.threads=1 --comm.train_timeout_seconds=120)
narrow=(--model.dim=128 --model.ffn_hidden=384)
run() { # name ranks args...
  local name=$1 n=$2; shift 2
  if [ "$n" -eq 1 ]; then "$CTITAN" train "${common[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1
  else "$CTITAN" launch -n "$n" train "${common[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1; fi \
    || { tail -20 "$T/$name.log"; fail "$name run"; }
}
step_records() { grep '"loss"' "$T/$1/metrics.jsonl"; } # the step records (not the start and end records)
compare() { same_curve "$2 vs $1" "$T/$1/metrics.jsonl" "$T/$2/metrics.jsonl" "$3"; } # reference run steps
mem() { step_records "$1" | sed -n 1p | sed 's/.*"params": \([0-9]*\), "grads": \([0-9]*\), "optimizer": \([0-9]*\).*/\1 \2 \3/' | awk '{print $1+$2+$3}'; }
