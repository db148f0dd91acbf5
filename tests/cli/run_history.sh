#!/usr/bin/env bash
# Run history, signals and locking: metrics.jsonl is appended (a start record, then step records,
# each with time and run_id), a second run into a busy dump folder is refused naming the holder's
# pid, files are not written through planted symlinks, a dump folder that is a file is refused,
# torchrun's and srun's environments without an MPI job are refused, a write error (file size
# limit) is reported; SIGTERM stops a run after its step with a checkpoint, and the resumed run
# continues bit-identically (one rank, and FSDP 2 stopped through `ctitan launch`); SIGINT and a
# SIGHUP to the launcher stop too; killing the launcher with SIGKILL leaves no rank or mpirun behind.
set -u
CTITAN=${CTITAN:-build/ctitan}
T=$(mktemp -d)
cleanup() { for p in $(pgrep -f "$T/" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done; rm -rf "$T"; }
trap cleanup EXIT
. tests/cli/lib/common.sh
. tests/cli/lib/data.sh
test_data "$T" 512 || fail "test data"
# a constant learning rate after warmup, so a run's steps do not depend on training.steps
base=(configs/llama3_debug.yaml --training.dataset_path="$T/data.bin" --model.vocab_size=512 --model.n_layers=2
      --model.dim=64 --model.n_heads=4 --model.n_kv_heads=2 --training.seq_len=32 --training.global_batch_size=8
      --metrics.log_freq=1 --generate.max_new_tokens=0 --activation_checkpoint.mode=none --device.threads=1
      --lr_scheduler.warmup_steps=3 --lr_scheduler.decay_ratio=0 --checkpoint.enable=true --checkpoint.interval=1000)
one=(--training.local_batch_size=8)
fsdp2=(--training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2)
steps_of() { grep '"loss"' "$T/$1/metrics.jsonl" | cut -d, -f1-3; } # step, loss, grad_norm (9 digits)
wait_step() { # log step: wait until the console shows that step
  for _ in $(seq 300); do grep -q "^step *$2 " "$1" && return 0; sleep 0.1; done
  cat "$1"; fail "step $2 never came"
}
gone_within() { # pattern seconds: no process matches within that time
  for _ in $(seq $(($2 * 10))); do pgrep -f "$1" >/dev/null || return 0; sleep 0.1; done
  pgrep -af "$1"; return 1
}

# 1. SIGTERM on one rank: stop after the step, checkpoint, message, 143; the resumed run appends and
#    continues bit-identically with an uninterrupted run.
"$CTITAN" train "${base[@]}" "${one[@]}" --training.steps=100000 --job.dump_folder="$T/stop1" >"$T/stop1.log" 2>&1 &
pid=$!
wait_step "$T/stop1.log" 5
# the lock: a second run into the same folder is refused, naming the first's pid
"$CTITAN" train "${base[@]}" "${one[@]}" --training.steps=3 --job.dump_folder="$T/stop1" >/dev/null 2>"$T/second.log"
rc=$?
[ $rc -eq 2 ] && grep -q "job.dump_folder: $T/stop1 is in use by pid $pid on .*; use another folder or stop that run" \
  "$T/second.log" || { cat "$T/second.log"; fail "second run into a busy folder: status $rc"; }
[ "$(grep -c . "$T/second.log")" -eq 1 ] || { cat "$T/second.log"; fail "the refusal is not one line"; }
echo "ok   a second run into a busy dump folder exits 2 naming pid $pid"
# a seed checkpoint (it writes step-0 there) takes the same lock
"$CTITAN" train "${base[@]}" "${one[@]}" --checkpoint.create_seed_checkpoint=true --job.dump_folder="$T/stop1" \
  >/dev/null 2>"$T/seed.log"
rc=$?
[ $rc -eq 2 ] && grep -q "is in use by pid $pid on " "$T/seed.log" && [ ! -e "$T/stop1/checkpoint/step-0" ] ||
  { cat "$T/seed.log"; fail "seed checkpoint into a busy folder: status $rc"; }
echo "ok   a seed checkpoint into a busy dump folder exits 2 naming pid $pid, writing nothing"
kill -TERM $pid
wait $pid; rc=$?
[ $rc -eq 143 ] || { tail -5 "$T/stop1.log"; fail "SIGTERM: status $rc, want 143"; }
k=$(sed -n 's/^ctitan: stopped by SIGTERM after step \([0-9]*\); checkpoint step-\1 saved$/\1/p' "$T/stop1.log")
[ -n "$k" ] && [ -f "$T/stop1/checkpoint/step-$k/metadata.json" ] || { tail -3 "$T/stop1.log"; fail "SIGTERM: no stop line or no step-$k"; }
grep -q "\"event\": \"stop\", \"signal\": \"SIGTERM\", \"last_step\": $k, \"checkpoint\": \"step-$k\"" "$T/stop1/metrics.jsonl" ||
  fail "no stop record"
echo "ok   SIGTERM on one rank: status 143, 'stopped by SIGTERM after step $k; checkpoint step-$k saved'"
n=$((k + 4))
"$CTITAN" train "${base[@]}" "${one[@]}" --training.steps=$n --job.dump_folder="$T/stop1" >"$T/resume1.log" 2>&1 ||
  { tail -5 "$T/resume1.log"; fail "resume after SIGTERM"; }
grep -q "resuming after step $k" "$T/resume1.log" || fail "did not resume after step $k"
"$CTITAN" train "${base[@]}" "${one[@]}" --training.steps=$n --job.dump_folder="$T/whole1" >/dev/null 2>&1 || fail "whole run"
cmp -s <(steps_of stop1) <(steps_of whole1) || { diff <(steps_of stop1) <(steps_of whole1) | head; fail "stopped + resumed differs from the whole run"; }
echo "ok   resumed after the stop: steps 1-$n each once, bit-identical to an uninterrupted run"
# the history: two starts (first steps 1 and k+1), each step record under its start's run_id
m=$T/stop1/metrics.jsonl
ids=$(grep '"event": "start"' "$m" | sed 's/.*"run_id": "\([^"]*\)".*/\1/' | tr '\n' ' ')
set -- $ids
[ $# -eq 2 ] && [ "$1" != "$2" ] || fail "want two starts with different run_ids: $ids"
grep '"event": "start"' "$m" | sed -n 1p | grep -q '"first_step": 1, "steps": 100000, "world_size": 1, "seed": 42, "manifest": "/' || fail "start record: $(sed -n 1p "$m")"
grep '"event": "start"' "$m" | sed -n 2p | grep -q "\"first_step\": $((k + 1)), \"steps\": $n" || fail "second start record"
[ "$(grep '"loss"' "$m" | grep -c "\"run_id\": \"$1\"")" -eq "$k" ] && [ "$(grep '"loss"' "$m" | grep -c "\"run_id\": \"$2\"")" -eq 4 ] ||
  fail "step records per run_id"
grep '"loss"' "$m" | grep -qvE '"time": "20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\.[0-9]{3}Z", "run_id": "[^"]+"}$' && fail "a record without time"
tail -1 "$m" | grep -q "\"event\": \"end\", \"last_step\": $n" || fail "no end record"
python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$m" 2>/dev/null || fail "metrics.jsonl does not parse"
echo "ok   metrics.jsonl appended: 2 starts ($1, $2), $k + 4 step records each with time and run_id, an end record"

# 2. The same under FSDP 2 through `ctitan launch` (SIGTERM to the launcher, forwarded to the ranks)
"$CTITAN" launch -n 2 train "${base[@]}" "${fsdp2[@]}" --training.steps=100000 --job.dump_folder="$T/stop2" >"$T/stop2.log" 2>&1 &
pid=$!
wait_step "$T/stop2.log" 5
kill -TERM $pid
wait $pid; rc=$?
[ $rc -eq 143 ] || { tail -5 "$T/stop2.log"; fail "FSDP 2 SIGTERM: status $rc, want 143"; }
k=$(sed -n 's/^\[rank 0\] ctitan: stopped by SIGTERM after step \([0-9]*\); checkpoint step-\1 saved$/\1/p' "$T/stop2.log")
[ -n "$k" ] && [ -f "$T/stop2/checkpoint/step-$k/metadata.json" ] || { tail -3 "$T/stop2.log"; fail "FSDP 2: no stop line or no step-$k"; }
n=$((k + 4))
"$CTITAN" launch -n 2 train "${base[@]}" "${fsdp2[@]}" --training.steps=$n --job.dump_folder="$T/stop2" >"$T/resume2.log" 2>&1 ||
  { tail -5 "$T/resume2.log"; fail "FSDP 2 resume"; }
"$CTITAN" launch -n 2 train "${base[@]}" "${fsdp2[@]}" --training.steps=$n --job.dump_folder="$T/whole2" >/dev/null 2>&1 || fail "FSDP 2 whole run"
cmp -s <(steps_of stop2) <(steps_of whole2) || fail "FSDP 2: stopped + resumed differs from the whole run"
echo "ok   FSDP 2 under ctitan launch: SIGTERM to the launcher stops both ranks after step $k (status 143); resumed bit-identically to $n"

gone_within "$T/stop2" 5 || fail "ranks or mpirun left after the stop"
# SIGHUP to the launcher reaches the ranks as SIGTERM (here with checkpoints off)
"$CTITAN" launch -n 2 train "${base[@]}" "${fsdp2[@]}" --training.steps=100000 --checkpoint.enable=false \
  --job.dump_folder="$T/hup" >"$T/hup.log" 2>&1 &
pid=$!
wait_step "$T/hup.log" 3
kill -HUP $pid
wait $pid; rc=$?
[ $rc -eq 143 ] && grep -qE '^\[rank 0\] ctitan: stopped by SIGTERM after step [0-9]+ \(checkpoints are off: nothing saved\)$' "$T/hup.log" ||
  { tail -3 "$T/hup.log"; fail "SIGHUP to the launcher: status $rc"; }
gone_within "$T/hup" 5 || fail "ranks or mpirun left after SIGHUP"
echo "ok   SIGHUP to ctitan launch: both ranks stop as by SIGTERM (status 143), none left"
# SIGINT with checkpoints off: the same stop, nothing saved, status 130
"$CTITAN" train "${base[@]}" "${one[@]}" --training.steps=100000 --checkpoint.enable=false --job.dump_folder="$T/int" >"$T/int.log" 2>&1 &
pid=$!
wait_step "$T/int.log" 3
kill -INT $pid
wait $pid; rc=$?
[ $rc -eq 130 ] && grep -qE '^ctitan: stopped by SIGINT after step [0-9]+ \(checkpoints are off: nothing saved\)$' "$T/int.log" ||
  { tail -3 "$T/int.log"; fail "SIGINT: status $rc"; }
echo "ok   SIGINT with checkpoints off: status 130, $(tail -1 "$T/int.log")"

# a second signal (another one: two SIGTERMs could merge while pending) ends the run at once, with the
# status of whichever the process handled second: when both are pending together the kernel delivers
# the lower-numbered SIGINT first, so 143 (SIGTERM second) is as right as 130
"$CTITAN" train "${base[@]}" "${one[@]}" --training.steps=100000 --job.dump_folder="$T/twice" >"$T/twice.log" 2>&1 &
pid=$!
wait_step "$T/twice.log" 3
kill -TERM $pid; kill -INT $pid
wait $pid; rc=$?
{ [ $rc -eq 130 ] || [ $rc -eq 143 ]; } && grep -q '^ctitan: a second stop signal: exiting now, nothing saved$' "$T/twice.log" &&
  ! grep -q "stopped by" "$T/twice.log" || { tail -3 "$T/twice.log"; fail "a second signal: status $rc"; }
echo "ok   a second signal exits at once (status $rc, nothing saved)"

# 3. Killing the launcher with SIGKILL: mpirun and the ranks end too
"$CTITAN" launch -n 2 train "${base[@]}" "${fsdp2[@]}" --training.steps=100000 --job.dump_folder="$T/orphan" >"$T/orphan.log" 2>&1 &
pid=$!
wait_step "$T/orphan.log" 3
{ kill -KILL $pid; wait $pid; } 2>/dev/null
gone_within "$T/orphan" 5 || fail "ranks or mpirun left 5 s after the launcher was killed"
echo "ok   launcher killed with SIGKILL: no rank or mpirun left within 5 s"

# 4. Refusals, each one line
refuse() { # name status pattern command...
  local name=$1 want=$2 pat=$3; shift 3
  "$@" >"$T/$name.out" 2>"$T/$name.err"; local rc=$?
  [ $rc -eq "$want" ] && grep -qE "$pat" "$T/$name.err" && [ "$(grep -c . "$T/$name.err")" -eq 1 ] ||
    { cat "$T/$name.err"; fail "$name: status $rc, want $want and one line matching: $pat"; }
  echo "ok   $name: $(cat "$T/$name.err")"
}
mkdir -p "$T/sym"; echo precious >"$T/target"; ln -s "$T/target" "$T/sym/metrics.jsonl"
refuse "metrics.jsonl symlink" 2 "job.dump_folder: cannot open $T/sym/metrics.jsonl to append: it is a symbolic link" \
  "$CTITAN" train "${base[@]}" "${one[@]}" --training.steps=2 --job.dump_folder="$T/sym"
[ "$(cat "$T/target")" = precious ] || fail "the symlink's target was written"
mkdir -p "$T/symctt"; ln -s "$T/target" "$T/symctt/model.ctt.tmp"
refuse "model.ctt.tmp symlink" 1 "model.ctt.tmp: it is a symbolic link" \
  "$CTITAN" train "${base[@]}" "${one[@]}" --training.steps=2 --checkpoint.enable=false --job.dump_folder="$T/symctt"
[ "$(cat "$T/target")" = precious ] || fail "the symlink's target was written"
touch "$T/afile"
refuse "dump folder is a file" 2 "command line: --job.dump_folder: $T/afile is not a folder" \
  "$CTITAN" train "${base[@]}" "${one[@]}" --training.steps=2 --job.dump_folder="$T/afile"
refuse "torchrun without MPI" 2 "started by torchrun \(WORLD_SIZE=2, RANK=1\) but not as an MPI job.*ctitan launch -n 2 train" \
  env WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 "$CTITAN" train "${base[@]}" "${one[@]}" --training.steps=2 --job.dump_folder="$T/torchrun"
refuse "srun without MPI" 2 "started by srun \(SLURM_STEP_NUM_TASKS=4, SLURM_PROCID=3\).*srun --mpi=pmix" \
  env SLURM_PROCID=3 SLURM_NTASKS=4 SLURM_STEP_NUM_TASKS=4 SLURM_STEP_ID=0 "$CTITAN" train "${base[@]}" "${one[@]}" \
  --training.steps=2 --job.dump_folder="$T/srun"
[ ! -e "$T/torchrun" ] && [ ! -e "$T/srun" ] || fail "a refused launch wrote its dump folder"
# a write error on metrics.jsonl (here a file size limit: EFBIG, as ENOSPC would be) is one line and status 1
mkdir -p "$T/full"; head -c 65000 /dev/zero | tr '\0' ' ' >"$T/full/metrics.jsonl"
refuse "metrics.jsonl write error" 1 "cannot write $T/full/metrics.jsonl: File too large" \
  bash -c 'trap "" XFSZ; ulimit -f 64; exec "$@"' - "$CTITAN" train "${base[@]}" "${one[@]}" --training.steps=2 \
  --checkpoint.enable=false --job.dump_folder="$T/full"
