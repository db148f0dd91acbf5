#!/usr/bin/env bash
# Context parallel computes the same function as one rank: a small llama3 (2 layers, dim 64, grouped
# kv heads; fp32), same seed and global batch, real MPI ranks. CP 2 and CP 4 with allgather and alltoall
# (the ring, also with its overlap off), FSDP 2 x CP 2, TP 2 x CP 2, PP 2 x CP 2,
# DDP 2 x CP 2, ZeRO-2 2 x CP 2, and on 8 ranks HSDP 2 x 2 x CP 2 and the 4D layouts dp_shard 2 x cp 2
# x tp 2 and pp 2 x cp 2 x dp_shard 2: 20-step loss and grad-norm curves within 1e-6 (relative) of
# the single rank; the ring with bf16 parameters and full activation checkpointing too (against one
# rank's same settings), and CP 2 with Llama 3.1's RoPE scaling (model.rope_scaling: llama3). CP 4 samples the same greedy text; each rank's live activations are 1/cp of
# one rank's. A checkpoint saved under CP 2 continues on one rank and under FSDP 2, and one rank's
# continues under CP 2, on the same curves; sdk/examples/gpt2 (learned positions, built out of tree)
# under CP 2 follows its one-rank curve; the planner sees per-rank activations and attention at 1/cp.
# Ulysses (rotate method ulysses: heads all-to-all'd over cp around attention), on the same model with
# 8 heads and 4 kv heads (GQA that cp 4 and tp 2 x cp 2 divide): CP 2, CP 4, FSDP 2 x CP 2, TP 2 x CP 2
# and PP 2 x CP 2, 8-step curves within 1e-6 of one rank's; the planner prices its attention (H/cp heads
# of the whole sequence) at 1/cp of one rank's, and 4 all-to-alls per layer forward and 4 backward.
# Bad input stops at start-up with status 2 naming the key: a degree that does not cut the sequence
# into 2 x cp chunks, a rotate method that does not exist (refused with cp 1 too), and ulysses where cp
# does not divide the kv heads (4 heads, 2 kv heads: cp 4, and cp 2 under tp 2), in one line.
set -u
. tests/cli/lib/layouts.sh
base=("${common[@]}")
common+=(--model.n_layers=2 --model.dim=64 --model.n_heads=4 --model.n_kv_heads=2 --model.ffn_hidden=128)
cp=(--training.local_batch_size=8 --parallelism.data_parallel_shard_degree=1)
ring=--parallelism.context_parallel_rotate_method=alltoall
ckpt=(--checkpoint.enable=true --checkpoint.interval=10)
sample=(--model.tokenizer_path="$T/tok.model" --generate.max_new_tokens=12 --generate.temperature=0) # greedy
run single 1 --training.local_batch_size=8 "${ckpt[@]}" "${sample[@]}"
run cp2 2 "${cp[@]}" --parallelism.context_parallel_degree=2 "${ckpt[@]}"
run cp2_ring 2 "${cp[@]}" --parallelism.context_parallel_degree=2 $ring
run cp2_ring_serial 2 "${cp[@]}" --parallelism.context_parallel_degree=2 $ring \
  --parallelism.context_parallel_ring_overlap=false
run cp4 4 "${cp[@]}" --parallelism.context_parallel_degree=4
run cp4_ring 4 "${cp[@]}" --parallelism.context_parallel_degree=4 $ring "${sample[@]}"
run fsdp2_cp2 4 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.context_parallel_degree=2
run tp2_cp2 4 "${cp[@]}" --parallelism.tensor_parallel_degree=2 --parallelism.context_parallel_degree=2 $ring
run pp2_cp2 4 "${cp[@]}" --parallelism.pipeline_parallel_degree=2 --parallelism.context_parallel_degree=2
run ddp2_cp2 4 --training.local_batch_size=4 --parallelism.data_parallel_replicate_degree=2 \
  --parallelism.data_parallel_shard_degree=1 --parallelism.context_parallel_degree=2 --parallelism.dp_strategy=ddp $ring
run zero2_cp2 4 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.context_parallel_degree=2 --parallelism.dp_strategy=zero2 $ring
run hsdp_cp2 8 --training.local_batch_size=2 --parallelism.data_parallel_replicate_degree=2 \
  --parallelism.data_parallel_shard_degree=2 --parallelism.context_parallel_degree=2
run fsdp2_cp2_tp2 8 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.context_parallel_degree=2 --parallelism.tensor_parallel_degree=2
run pp2_cp2_fsdp2 8 --training.local_batch_size=4 --parallelism.pipeline_parallel_degree=2 \
  --parallelism.context_parallel_degree=2 --parallelism.data_parallel_shard_degree=2 $ring
# bf16 parameters with full activation checkpointing: the recomputed forward runs the ring again
bf16=(--training.mixed_precision_param=bfloat16 --activation_checkpoint.mode=full)
run single_bf16_ac 1 --training.local_batch_size=8 "${bf16[@]}"
run cp2_ring_bf16_ac 2 "${cp[@]}" --parallelism.context_parallel_degree=2 $ring "${bf16[@]}"
CURVE_TOL=$CURVE_TOL_BF16 compare single_bf16_ac cp2_ring_bf16_ac 20 || exit 1
# Ulysses: 8 steps of a model whose 8 heads and 4 kv heads divide by cp 4 and by tp 2 x cp 2
uly=(--model.n_heads=8 --model.n_kv_heads=4 --training.steps=8)
ulysses=--parallelism.context_parallel_rotate_method=ulysses
run single_h8 1 --training.local_batch_size=8 "${uly[@]}"
run cp2_ulysses 2 "${cp[@]}" --parallelism.context_parallel_degree=2 $ulysses "${uly[@]}"
run cp4_ulysses 4 "${cp[@]}" --parallelism.context_parallel_degree=4 $ulysses "${uly[@]}"
run fsdp2_cp2_ulysses 4 --training.local_batch_size=4 --parallelism.data_parallel_shard_degree=2 \
  --parallelism.context_parallel_degree=2 $ulysses "${uly[@]}"
run tp2_cp2_ulysses 4 "${cp[@]}" --parallelism.tensor_parallel_degree=2 --parallelism.context_parallel_degree=2 \
  $ulysses "${uly[@]}"
run pp2_cp2_ulysses 4 "${cp[@]}" --parallelism.pipeline_parallel_degree=2 --parallelism.context_parallel_degree=2 \
  $ulysses "${uly[@]}"
for r in "cp2_ulysses 2 cp ranks attends 4 of the 8 query heads and 2 of the 4 kv heads over" \
         "cp4_ulysses 4 cp ranks attends 2 of the 8 query heads and 1 of the 4 kv heads over" \
         "tp2_cp2_ulysses 2 cp ranks attends 2 of the 4 query heads and 1 of the 2 kv heads of its tp rank"; do
  grep -q "context parallel ulysses: each of ${r#* }" "$T/${r%% *}.log" || fail "${r%% *}: no line '... each of ${r#* }'"
done
for r in cp2_ulysses cp4_ulysses fsdp2_cp2_ulysses tp2_cp2_ulysses pp2_cp2_ulysses; do
  compare single_h8 $r 8 || exit 1
done
# metrics.jsonl counts the all-to-alls: per layer q and the output (8 x 32 local rows x dim 64), k and v
# (x 32: 4 kv heads of 8 dims) forward and their conjugates backward, f32: 2 layers x 2 x 196,608 bytes
# a step; none without
a2a() { step_records "$1" | tail -1 | sed 's/.*"all_to_all": \([0-9]*\).*/\1/'; }
got=$(a2a cp2_ulysses); want=$((8 * 2 * 2 * (2 * 8 * 32 * 64 + 2 * 8 * 32 * 32) * 4))
[ "$got" = "$want" ] || fail "cp2_ulysses: comm_bytes.all_to_all $got after 8 steps, expected $want"
[ "$(a2a cp2)" = 0 ] || fail "cp2 (allgather): comm_bytes.all_to_all $(a2a cp2), expected 0"
echo "ok   cp2_ulysses: comm_bytes.all_to_all $got after 8 steps (2 layers x 2 x 196608 a step); cp2 allgather 0"
grep -q "dp_shard 1, cp 4, tp 1" "$T/cp4.log" || fail "cp4 did not run with cp 4"
grep -q "dp_shard 2, cp 2, tp 2; strategy fsdp" "$T/fsdp2_cp2_tp2.log" || fail "fsdp2_cp2_tp2 layout"
grep -q "pp 2, dp_replicate 1, dp_shard 2, cp 2, tp 1; strategy fsdp" "$T/pp2_cp2_fsdp2.log" || fail "pp2_cp2_fsdp2 layout"
grep -q "dp_replicate 2, dp_shard 1, cp 2, tp 1; strategy ddp" "$T/ddp2_cp2.log" || fail "ddp2_cp2 layout"
grep -q "dp_shard 2, cp 2, tp 1; strategy zero2" "$T/zero2_cp2.log" || fail "zero2_cp2 layout"
grep -q "dp_replicate 2, dp_shard 2, cp 2, tp 1; strategy fsdp" "$T/hsdp_cp2.log" || fail "hsdp_cp2 layout"
for r in cp2 cp2_ring cp2_ring_serial cp4 cp4_ring fsdp2_cp2 tp2_cp2 pp2_cp2 ddp2_cp2 zero2_cp2 hsdp_cp2 fsdp2_cp2_tp2 \
         pp2_cp2_fsdp2; do
  compare single $r 20 || exit 1
done

# Llama 3.1's RoPE scaling (rope_freqs at each rank's real positions): CP 2 on the ring follows one
# rank; original_max_position 16 scales every pair at seq_len 64, so the curve is not the plain one
scaled=(--model.rope_scaling=llama3 --model.rope_original_max_position=16)
run single_scaled 1 --training.local_batch_size=8 "${scaled[@]}"
run cp2_scaled 2 "${cp[@]}" --parallelism.context_parallel_degree=2 $ring "${scaled[@]}"
compare single_scaled cp2_scaled 20 || exit 1
! diff -q <(curve_records "$T/single/metrics.jsonl") <(curve_records "$T/single_scaled/metrics.jsonl") >/dev/null ||
  fail "rope_scaling llama3 did not change the curve"

# deterministic: the ring with its overlap off (the same sums, only the waits moved) gives the same bits
diff <(curve_records "$T/cp2_ring/metrics.jsonl") <(curve_records "$T/cp2_ring_serial/metrics.jsonl") >/dev/null ||
  fail "cp2_ring and cp2_ring_serial differ: the ring's results depend on its timing"
echo "ok   the ring with and without overlap: identical losses and grad norms"

# sampling pads the prompt to 2 x cp tokens and gathers the logits' rows: the same greedy text
text() { sed -n '/^sample:/{n;p}' "$T/$1.log" | sed 's/^\[rank [0-9]*\] //'; }
[ -n "$(text single)" ] && [ "$(text single)" = "$(text cp4_ring)" ] || fail "cp4_ring sampled '$(text cp4_ring)', one rank '$(text single)'"
echo "ok   cp4_ring samples what one rank samples: $(text cp4_ring)"

# each rank keeps its own rows' activations: the live peak per rank falls to about 1/cp (step 3)
live() { step_records "$1" | sed -n 3p | sed 's/.*"activations_live_peak": \([0-9]*\).*/\1/'; }
for r in "cp2 2" "cp2_ring 2" "cp4 4" "cp4_ring 4"; do set -- $r
  awk -v s="$(live single)" -v g="$(live "$1")" -v n="$2" -v r="$1" 'BEGIN { q = g * n / s
    printf "%s %s: activations live peak %d bytes per rank, one rank %d: %.4f x 1/%d\n", (q > 0.95 && q < 1.05) ? "ok  " : "FAIL",
           r, g, s, q, n; exit !(q > 0.95 && q < 1.05) }' || exit 1
done

# the ring reports how much of its communication hid behind attention (rank 0, at the end)
for r in cp2_ring cp2_ring_serial cp4_ring; do
  line=$(grep -m1 "context parallel ring: " "$T/$r.log") || fail "$r: no ring overlap line"
  echo "ok   $r: ${line#*context parallel ring: }"
done

# checkpoints across layouts: CP 2's step 10 on one rank and under FSDP 2; one rank's under CP 2
resume() { # name ranks from-run args...
  local name=$1 n=$2 from=$3; shift 3
  mkdir -p "$T/$name/checkpoint" && cp -r "$T/$from/checkpoint/step-10" "$T/$name/checkpoint/"
  run "$name" "$n" --checkpoint.enable=true "$@"
  grep -q "resuming after step 10" "$T/$name.log" || fail "$name: did not resume"
  same_curve "$name: step-10 checkpoint of $from continued" "$T/$from/metrics.jsonl" "$T/$name/metrics.jsonl" 10 11
}
resume cp2_to_single 1 cp2 --training.local_batch_size=8 || exit 1
resume cp2_to_fsdp2 2 cp2 --training.local_batch_size=4 || exit 1
resume single_to_cp2 2 single "${cp[@]}" --parallelism.context_parallel_degree=2 || exit 1

# an out-of-tree pack with learned positions (sdk/examples/gpt2: the positions op, no RoPE, biases),
# built with nothing but the pkg-config file, under CP 2 with each rotate method
ROOT=$(pwd)
cp -r sdk/examples/gpt2 "$T/gpt2" && rm -f "$T"/gpt2/*.so
env -u MAKEFLAGS -u MFLAGS -u CFLAGS -u CPPFLAGS -u LDFLAGS PKG_CONFIG_PATH="$ROOT/$BUILD" \
  make --no-print-directory -C "$T/gpt2" >"$T/make.log" 2>&1 || { cat "$T/make.log"; fail "gpt2: out-of-tree build"; }
common=("${base[@]}" --model.name="$T/gpt2/gpt2.so" --model.flavor=tiny --model.vocab_size=2048)
run gpt2_single 1 --training.local_batch_size=8
run gpt2_cp2 2 "${cp[@]}" --parallelism.context_parallel_degree=2
run gpt2_cp2_ring 2 "${cp[@]}" --parallelism.context_parallel_degree=2 $ring
for r in gpt2_cp2 gpt2_cp2_ring; do compare gpt2_single $r 20 || exit 1; done
common=("${base[@]}" --model.n_layers=2 --model.dim=64 --model.n_heads=4 --model.n_kv_heads=2 --model.ffn_hidden=128)

# the planner sees cp through the plugin's plan callbacks: debugmodel at seq 4096 on h100-sxm, per-rank
# activations and attention time at about 1/cp of one rank's (the load-balanced chunks), both methods
planned() { # cp method -> "activations_gib attention_s"
  "$CTITAN" plan configs/llama3_debug.yaml --training.seq_len=4096 --training.local_batch_size=1 \
    --training.global_batch_size=1 --parallelism.data_parallel_shard_degree=1 --parallelism.context_parallel_degree="$1" \
    --parallelism.context_parallel_rotate_method="$2" --hardware h100-sxm --gpus "$1" --json |
    python3 -c 'import json, sys; l = json.load(sys.stdin)["layouts"][0]; print(l["memory_gib"]["activations"], l["time_s"]["attention"])'
}
one=$(planned 1 allgather) || fail "plan: one rank"
for n in 2 4; do for m in allgather alltoall; do
  got=$(planned $n $m) || fail "plan: cp $n $m"
  awk -v a="$one" -v b="$got" -v n=$n -v m=$m 'BEGIN { split(a, x, " "); split(b, y, " "); qa = y[1] * n / x[1]; qt = y[2] * n / x[2]
    ok = qa > 0.95 && qa < 1.05 && qt > 0.95 && qt < 1.05
    printf "%s plan cp %d %s: activations %.4f GiB, attention %.3g s per rank: %.3f and %.3f x 1/%d of one rank'"'"'s\n",
           ok ? "ok  " : "FAIL", n, m, y[1], y[2], qa, qt, n; exit !ok }' || exit 1
done; done
# ulysses: attention on H/cp heads of the whole sequence at 1/cp of one rank's, and 4 all-to-alls per
# layer forward and 4 backward (debugmodel: 16 heads, 16 kv heads, 6 layers)
for n in 2 4; do
  "$CTITAN" plan configs/llama3_debug.yaml --training.seq_len=4096 --training.local_batch_size=1 \
    --training.global_batch_size=1 --parallelism.data_parallel_shard_degree=1 --parallelism.context_parallel_degree=$n \
    $ulysses --hardware h100-sxm --gpus $n --json >"$T/plan_ulysses$n.json" || fail "plan: cp $n ulysses"
  python3 - "$T/plan_ulysses$n.json" "$one" $n <<'PY' || exit 1
import json, sys
l = json.load(open(sys.argv[1]))["layouts"][0]
one_att, n = float(sys.argv[2].split()[1]), int(sys.argv[3])
a2a = [c for c in l["collectives"] if c["what"] == "cp all_to_all"]
calls = a2a[0]["count"] if a2a else 0
q = l["time_s"]["attention"] * n / one_att
ok = 0.95 < q < 1.05 and calls == 6 * 8 and l["parallelism"]["context_parallel_rotate_method"] == "ulysses"
print("%s plan cp %d ulysses: attention %.3g s per rank, %.3f x 1/%d of one rank's; %d all-to-alls per step (6 layers x 8)"
      % ("ok  " if ok else "FAIL", n, l["time_s"]["attention"], q, n, calls))
sys.exit(0 if ok else 1)
PY
done

# bad input: status 2 before any step, the key named
expect_refusal() { # what key ranks args...
  local what=$1 key=$2 n=$3; shift 3
  local out st
  if [ "$n" -eq 1 ]; then out=$("$CTITAN" train "${common[@]}" "$@" 2>&1); st=$?
  else out=$("$CTITAN" launch -n "$n" train "${common[@]}" "$@" 2>&1); st=$?; fi
  [ $st -eq 2 ] || { echo "$out" | tail -4; fail "$what: status $st, expected 2"; }
  echo "$out" | grep -qE "$key" || { echo "$out" | tail -4; fail "$what: the message does not name $key"; }
  ! echo "$out" | grep -q '"loss"\|^step ' || fail "$what: trained before refusing"
  echo "ok   $what (status 2): $(echo "$out" | grep -m1 -E "$key" | sed 's/^\[rank [0-9]*\] //' | cut -c1-200)"
}
expect_refusal "seq_len 66 under cp 2 (not 4 equal chunks)" "context_parallel_degree" 2 "${cp[@]}" \
  --training.seq_len=66 --parallelism.context_parallel_degree=2
expect_refusal "an unknown rotate method (cp 1)" "context_parallel_rotate_method.*allgather" 1 --training.local_batch_size=8 \
  --parallelism.context_parallel_rotate_method=ring
expect_refusal "ulysses with 2 kv heads over cp 4" "context_parallel_rotate_method.*context_parallel_degree 4.*n_heads 4 and n_kv_heads 2" \
  4 "${cp[@]}" --parallelism.context_parallel_degree=4 $ulysses
expect_refusal "ulysses with 1 kv head per tp rank over cp 2" \
  "context_parallel_rotate_method.*tp rank.*context_parallel_degree 2.*n_heads 4 and n_kv_heads 2 over tensor_parallel_degree 2 leave 2 and 1" \
  4 "${cp[@]}" --parallelism.context_parallel_degree=2 --parallelism.tensor_parallel_degree=2 $ulysses
n=$("$CTITAN" launch -n 4 train "${common[@]}" "${cp[@]}" --parallelism.context_parallel_degree=4 $ulysses 2>&1 |
   grep -v "\[info " | grep -c .)
[ "$n" -eq 1 ] || fail "the ulysses refusal took $n lines besides the info ones, expected one"
echo "ok   the ulysses refusal is one line"
