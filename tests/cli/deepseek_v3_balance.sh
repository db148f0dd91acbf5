#!/usr/bin/env bash
# DeepSeek-V3's aux-loss-free balancing balances: a skewed router is evened out by the expert-bias updates
# alone. The debugmodel shrunk (2 blocks, the second MoE: 8 experts, top-2 by softmax) starts with its expert
# bias at 0.02 on experts 0 and 1 (model.expert_bias_skew, a test-only start), which near-uniform scores
# (spread about 0.01) let take most tokens. The skew, max / mean of the per-expert counts the pack logs
# (model.moe_log_load), measured over 20 steps of 512 tokens:
#   load_balance_coeff 2e-3   3.42 at step 1, falling to 1.24 by step 6; at most 1.40 over steps 8 to 20
#   load_balance_coeff 0      3.42 at step 1, still 3.02 to 3.39 at every step after
# The test asks: step 1 above 3 in both runs; with balancing every step from 8 on under 1.5; without it
# every step above 2.5 (the bias, not the router's training, did the evening out).
set -u
STEPS=20
. tests/cli/lib/layouts.sh
ds=(--model.name=deepseek_v3 --model.flavor=debugmodel --model.dim=64 --model.n_layers=2 --model.n_heads=4
    --model.kv_lora_rank=32 --model.qk_nope_head_dim=16 --model.qk_rope_head_dim=8 --model.v_head_dim=16
    --model.inter_dim=128 --model.moe_inter_dim=32 --model.vocab_size=2048 --model.top_k=2
    --model.expert_bias_skew=0.02 --model.moe_log_load=true --optimizer.lr=3e-4 --training.local_batch_size=8)
skew() { # RUN: "step max/mean" per logged load line
  grep -o 'moe load step .*' "$T/$1.log" |
    awk '{s = 0; m = 0; for (i = 6; i <= NF; i++) { s += $i; if ($i > m) m = $i }; printf "%d %.3f\n", $4, m / (s / (NF - 5))}'
}
check() { # NAME RUN FROM TO OP BOUND: every step in FROM..TO has max/mean OP BOUND (OP: lt or gt)
  local steps; steps=$(skew "$2" | awk -v f="$3" -v t="$4" '$1 >= f && $1 <= t')
  if [ -n "$steps" ] && ! echo "$steps" | awk -v op="$5" -v b="$6" '(op == "lt" && $2 >= b) || (op == "gt" && $2 <= b) {bad = 1}
      END {exit bad}'; then
    echo "FAIL $1: max/mean load not $5 $6 at steps $3..$4:" $(skew "$2"); return 1
  fi
  echo "ok   $1: max/mean load $5 $6 at steps $3..$4 (measured $(echo "$steps" | awk '{print $2}' | sort -g |
    sed -n '1p;$p' | paste -sd' ' | sed 's/ / to /'))"
}
fails=0
run balanced 1 "${ds[@]}" --model.load_balance_coeff=2e-3
run unbalanced 1 "${ds[@]}" --model.load_balance_coeff=0
check "balanced run starts skewed" balanced 1 1 gt 3 || fails=$((fails + 1))
check "balanced by the bias updates" balanced 8 $STEPS lt 1.5 || fails=$((fails + 1))
check "left skewed without them (load_balance_coeff 0)" unbalanced 1 $STEPS gt 2.5 || fails=$((fails + 1))
[ $fails -eq 0 ] && echo "deepseek_v3_balance: ok" || { echo "deepseek_v3_balance: $fails failed"; exit 1; }
