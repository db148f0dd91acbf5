#!/usr/bin/env bash
# abi_frozen: plugins built against a frozen copy of an older 2.x SDK load and train under this host.
#
# sdk/frozen/<X.Y>/ctitan/ holds the public headers exactly as minor X.Y of ABI 2 released them
# (SHA256SUMS in each folder; a changed byte fails here, so a frozen copy cannot drift). For each
# frozen minor, three plugins of different kinds are built against those headers alone (never
# sdk/include): an SGD optimizer (tests/cli/lib/sgd_abi2_0.c, the SDK template of 2.0; the template
# is now Lion, which needs 2.1's ew_* ops), the out-of-tree mlp_tp operation-level strategy and the
# ReverseGPipe schedule. The host must list them with that minor, check the schedule, and train a
# 2-layer debugmodel with SGD under mlp_tp on 2 ranks to the one-rank losses (1e-6 relative; one
# run on one rank, with the oldest minor's SGD, is the reference of every minor's).
set -u
. tests/cli/lib/data.sh
BUILD=${BUILD:-build}; CTITAN=${CTITAN:-$BUILD/ctitan}
. tests/cli/lib/common.sh
test_tmp
WARN=(-std=c11 -Wall -Wextra -Werror -O2 -shared -fPIC -fvisibility=hidden)
test_data "$T" 2048
printf 'model:\n  name: llama3\n  flavor: debugmodel\n  vocab_size: 2048\n  n_layers: 2\n' >"$T/m.yaml"
n=0
for dir in sdk/frozen/*/; do
  ver=$(basename "$dir")
  (cd "$dir" && sha256sum --quiet -c SHA256SUMS) || fail "sdk/frozen/$ver: the frozen headers were changed"
  [ "$(find "$dir/ctitan" -name '*.h' | wc -l)" -eq "$(wc -l <"$dir/SHA256SUMS")" ] || fail "sdk/frozen/$ver: a header is not in SHA256SUMS"
  out="$T/$ver"; mkdir -p "$out"
  cc -I"$dir" "${WARN[@]}" -o "$out/ctitan-sgd.so" tests/cli/lib/sgd_abi2_0.c || fail "$ver: sgd"
  cc -I"$dir" "${WARN[@]}" -o "$out/ctitan-mlp_tp.so" sdk/examples/mlp_tp/mlp_tp.c || fail "$ver: mlp_tp"
  cc -I"$dir" "${WARN[@]}" -o "$out/ctitan-reverse.so" sdk/examples/schedule_reverse/reverse_gpipe.c || fail "$ver: reverse"
  listed=$("$CTITAN" plugins "$out" | grep -cE " $ver +$out/")
  [ "$listed" -eq 3 ] || { "$CTITAN" plugins "$out"; fail "$ver: ctitan plugins lists $listed of 3 at ABI $ver"; }
  "$CTITAN" schedule --name "$out/ctitan-reverse.so" --pp 2 --microbatches 4 >"$T/sched.log" 2>&1 \
    || { cat "$T/sched.log"; fail "$ver: the schedule did not check"; }
  args=(train "$T/m.yaml" --training.dataset_path="$T/data.bin" --training.seq_len=32 --training.local_batch_size=4
        --training.steps=4 --metrics.log_freq=1 --generate.max_new_tokens=0 --device.threads=1
        --optimizer.name="$out/ctitan-sgd.so" --optimizer.lr=0.01 --lr_scheduler.warmup_steps=0)
  # one rank, once: the oldest minor's optimizer (the same source under every minor's headers)
  [ -n "${one:-}" ] || { one=$T/one$ver
    "$CTITAN" "${args[@]}" --job.dump_folder="$one" >"$T/one.log" 2>&1 || { tail -5 "$T/one.log"; fail "$ver: one rank"; }; }
  "$CTITAN" launch -n 2 "${args[@]}" --parallelism.tp_strategy="$out/ctitan-mlp_tp.so" \
    --parallelism.tensor_parallel_degree=2 --parallelism.data_parallel_shard_degree=1 --job.dump_folder="$T/two$ver" \
    >"$T/two.log" 2>&1 || { tail -5 "$T/two.log"; fail "$ver: training with the frozen-header plugins"; }
  grep -q "tp 2; strategy none" "$T/two.log" || fail "$ver: the 2-rank run did not run tp 2"
  loss() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"loss": \([-0-9.e+]*\).*/\1/'; }
  paste -d' ' <(loss "$one") <(loss "$T/two$ver") | awk -v v="$ver" '
    { d = $1 - $2; if (d < 0) d = -d; if (d / $1 > worst) worst = d / $1; last = $2 }
    END { ok = NR == 4 && worst <= 1e-6; printf "%s ABI %s headers: sgd, mlp_tp and ReverseGPipe load; mlp_tp 2 + sgd within %.1e of one rank over %d steps (loss %s)\n",
          ok ? "ok  " : "FAIL", v, worst, NR, last; exit !ok }' || exit 1
  n=$((n+1))
done
[ "$n" -gt 0 ] || fail "no frozen SDK under sdk/frozen/"
