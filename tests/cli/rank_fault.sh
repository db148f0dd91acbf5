#!/usr/bin/env bash
# A rank killed mid-run: the surviving ranks leave their collective at the timeout with a message
# naming it, the job ends non-zero, and nothing hangs.
set -u
CTITAN=${CTITAN:-build/ctitan}
T=$(mktemp -d); trap 'rm -rf "$T"; pkill -9 -f "$T/out" 2>/dev/null' EXIT
. tests/cli/lib/common.sh
corpus=tests/data/tokenizer/corpus.txt
"$CTITAN" tokenizer train --input "$corpus" --vocab-size 512 --output "$T/tok.model" >/dev/null
"$CTITAN" tokenize --tokenizer "$T/tok.model" --input "$corpus" --output "$T/data.bin" >/dev/null
TIMEOUT=5
start=$SECONDS
"$CTITAN" launch -n 3 train configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --model.vocab_size=512 \
  --model.n_layers=2 --training.seq_len=32 --training.local_batch_size=2 --training.steps=100000 \
  --parallelism.data_parallel_shard_degree=3 --comm.train_timeout_seconds=$TIMEOUT --generate.max_new_tokens=0 \
  --device.threads=1 --metrics.log_freq=1 --job.dump_folder="$T/out" >"$T/log" 2>&1 &
launcher=$!
# wait for training to be under way, then kill rank 2
for _ in $(seq 120); do grep -q '^step *3 ' "$T/log" && break; sleep 0.5; done
grep -q '^step *3 ' "$T/log" || { cat "$T/log"; fail "training did not start"; }
victim=$(pgrep -f "ctitan train .*$T/out" | while read -r p; do
  [ "$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep '^OMPI_COMM_WORLD_RANK=')" = OMPI_COMM_WORLD_RANK=2 ] && echo "$p"; done | head -1)
[ -n "$victim" ] || fail "cannot find rank 2"
killed_at=$SECONDS
kill -9 "$victim"
# the job must end on its own well within the timeout plus start-up slack
for _ in $(seq 120); do kill -0 $launcher 2>/dev/null || break; sleep 0.5; done
if kill -0 $launcher 2>/dev/null; then kill -9 $launcher; cat "$T/log"; fail "the job hangs 60 s after a rank died"; fi
wait $launcher; rc=$?
took=$((SECONDS - killed_at))
[ $rc -ne 0 ] || { cat "$T/log"; fail "the job exited 0 after a rank died"; }
grep -E "^\[rank [01]\] .*(all_gather|reduce_scatter|all_reduce|barrier).* on group .*no completion within $TIMEOUT s" "$T/log" \
  | head -1 | grep -q . || { cat "$T/log"; fail "no survivor named the collective that timed out"; }
echo "ok   rank 2 killed; job ended with status $rc after ${took} s (timeout ${TIMEOUT} s):"
grep -E "no completion within" "$T/log" | head -2 | sed 's/^/     /'
