# layouts.sh: sourced by the layout-equivalence tests (fsdp_, tp_, pp_equivalence.sh). Trains a
# tokenizer on the test corpus into $T, and defines:
#   common   the debugmodel fp32 settings every run shares ($STEPS steps, global batch 8 x 64 tokens)
#   run NAME RANKS ARGS...   one run (launched on RANKS ranks when > 1), its log in $T/NAME.log
#   field RUN KEY            a metrics.jsonl column of $T/RUN
#   compare REF RUN N        RUN's N losses against REF's: step 1 within 1e-6, all within 1e-4
#   mem RUN                  bytes of parameters + gradients + optimizer states per rank (first step)
CTITAN=${CTITAN:-build/ctitan}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL $*"; exit 1; }
STEPS=${STEPS:-20}
corpus=tests/data/tokenizer/corpus.txt
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 2048 --output "$T/tok.model" >/dev/null || fail "tokenizer"
"$CTITAN" tokenize --tokenizer "$T/tok.model" --input "$corpus" --output "$T/data.bin" >/dev/null || fail "tokenize"
common=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --training.seq_len=64
        --training.global_batch_size=8 --training.steps=$STEPS --metrics.log_freq=1 --generate.max_new_tokens=0
        --training.mixed_precision_param=float32 --activation_checkpoint.mode=none --lr_scheduler.warmup_steps=5
        --device.threads=1 --comm.train_timeout_seconds=120)
run() { # name ranks args...
  local name=$1 n=$2; shift 2
  if [ "$n" -eq 1 ]; then "$CTITAN" train "${common[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1
  else "$CTITAN" launch -n "$n" train "${common[@]}" --job.dump_folder="$T/$name" "$@" >"$T/$name.log" 2>&1; fi \
    || { tail -20 "$T/$name.log"; fail "$name run"; }
}
step_records() { grep '"loss"' "$T/$1/metrics.jsonl"; } # the step records (not the start and end records)
field() { step_records "$1" | sed "s/.*\"$2\": \([-0-9.e+]*\).*/\1/"; }
compare() { # reference run steps
  [ "$(step_records "$2" | wc -l)" -eq "$3" ] || fail "$2: metrics.jsonl has $(step_records "$2" | wc -l) step records"
  paste -d' ' <(field "$1" loss | head -"$3") <(field "$2" loss) | awk -v r="$2" -v n="$3" -v ref="$1" '
    { d = $1 - $2; if (d < 0) d = -d; rel = d / $1; if (rel > worst) worst = rel
      if (NR == 1) { first = $1; if (rel > 1e-6) { printf "FAIL %s: step-1 loss %s vs %s %s\n", r, $2, ref, $1; bad = 1 } }
      if (rel > 1e-4) { printf "FAIL %s: step %d loss %s vs %s %s\n", r, NR, $2, ref, $1; bad = 1 } }
    END { if (!bad) printf "ok   %s: %d losses within %.1e of %s (step-1 loss %s)\n", r, n, worst, ref, first; exit bad }'
}
mem() { step_records "$1" | sed -n 1p | sed 's/.*"params": \([0-9]*\), "grads": \([0-9]*\), "optimizer": \([0-9]*\).*/\1 \2 \3/' | awk '{print $1+$2+$3}'; }
