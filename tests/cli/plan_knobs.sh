#!/usr/bin/env bash
# plan_knobs: a third party's search knobs (ABI 2.21, ct_plugin_info.knobs) are the planner's. A test
# strategy loaded by path as parallelism.cp_strategy (tests/plugins/knobcheck.c) declares two knobs the
# host has never heard of: knobcheck_overlap (false|true; true hides its per-unit all-gather) and
# knobcheck_exchange (gather|none; none drops it). On 2 GPUs with a global batch of 1 and a one-head,
# one-layer model, cp 2 is the only mesh, so `ctitan plan --search` must
#   - start from the first values and tune each knob to its second (the reported gather gone),
#   - print them in the layout line after the cp degree ("cp 2 (hidden) (none)") and in JSON (the
#     layout's `knobs` by whole key, `parallelism` by the last word),
#   - write both in the manifest it proposes, which plans again to the same tokens/s;
# the layout with the first values is evaluated too, slower by the gather it reports. The shipped
# knobs keep their keys in the same places (tp's async TP and float8's switch on Llama 3 1B), and tp's
# later spelling of async TP, the one it declares, wins over the older one when both are given. A knob
# list naming an option the plugin does not have is refused at load: exit 2, one line.
set -uo pipefail
BUILD=${BUILD:-build}; CTITAN=${CTITAN:-$BUILD/ctitan}
. tests/cli/lib/common.sh
counting_fails
ok() { echo "ok:   $*"; }
test_tmp
WORK=$T

so=$BUILD/tests/plugins/ctitan-knobcheck.so
PC=$(PKG_CONFIG_PATH="$BUILD" pkg-config --cflags ctitan-sdk 2>/dev/null) || PC=-Isdk/include
if [ ! "$so" -nt tests/plugins/knobcheck.c ]; then # not built by make (or stale): build it here
    so=$WORK/ctitan-knobcheck.so
    cc $PC -std=c11 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden -o "$so" tests/plugins/knobcheck.c ||
        { echo "FAIL cannot build the knobcheck strategy"; exit 1; }
fi
case $so in /*) ;; *) so=$(pwd)/$so ;; esac

ARGS=(configs/llama3_debug.yaml --hardware h100-sxm --gpus 2 --training.seq_len=2048 --training.global_batch_size=1
      --model.n_layers=1 --model.n_heads=1 --model.n_kv_heads=1 --parallelism.cp_strategy="$so")

if "$CTITAN" plan "${ARGS[@]}" --search --top 20 --json --write-manifest "$WORK/win.yaml" >"$WORK/s.json" 2>"$WORK/err"; then
    python3 - "$WORK/s.json" "$WORK/win.yaml" <<'PY' && ok "--search varies both knobs of the test strategy and writes them" ||
import json, sys
d = json.load(open(sys.argv[1]))
ls = d["layouts"]
w = ls[0]
assert w["parallelism"]["context_parallel_degree"] == 2, w["parallelism"]
k = w["knobs"]
assert k.get("parallelism.knobcheck_overlap") == "true" and k.get("parallelism.knobcheck_exchange") == "none", k
assert w["parallelism"]["knobcheck_overlap"] is True and w["parallelism"]["knobcheck_exchange"] == "none", w["parallelism"]
assert not any(c["what"].startswith("knobcheck") for c in w["collectives"]), w["collectives"]
first = [l for l in ls if l["knobs"].get("parallelism.knobcheck_exchange") == "gather"
         and l["knobs"].get("parallelism.knobcheck_overlap") == "false"]
assert first, "the first values were never evaluated"
g = [c for c in first[0]["collectives"] if c["what"] == "knobcheck all_gather"]
assert g and g[0]["exposed_s"] > 0 and first[0]["tokens_per_s_per_gpu"] < w["tokens_per_s_per_gpu"], first[0]
y = open(sys.argv[2]).read()
assert "knobcheck_overlap: true\n" in y and 'knobcheck_exchange: "none"\n' in y, y
print("   winner %.0f tokens/s per GPU; the first values %.0f, their gather exposed %.3g s" %
      (w["tokens_per_s_per_gpu"], first[0]["tokens_per_s_per_gpu"], g[0]["exposed_s"]))
PY
    fail "--search with the test strategy's knobs"
else
    fail "plan --search with the test strategy exited $?: $(head -c 300 "$WORK/err")"
fi

# the text names the knobs after the cp degree, the first values' layout too
"$CTITAN" plan "${ARGS[@]}" --search --top 20 >"$WORK/s.txt" 2>"$WORK/err" &&
    grep -qE "^  layout: dp_replicate 1 x dp_shard 1 x cp 2 \(hidden\) \(none\) x tp 1 " "$WORK/s.txt" &&
    grep -qE "^  layout: dp_replicate 1 x dp_shard 1 x cp 2 \(gather\) x tp 1 " "$WORK/s.txt" &&
    ok "the text: $(grep -m1 '^  layout:' "$WORK/s.txt" | cut -c1-90)" ||
    fail "the text's layout lines: $(grep -m3 '^  layout:' "$WORK/s.txt")"

# the written manifest plans again to the winner's tokens/s
if [ -s "$WORK/win.yaml" ] && "$CTITAN" plan "$WORK/win.yaml" --hardware h100-sxm --gpus 2 --json >"$WORK/again.json" 2>"$WORK/err"; then
    python3 - "$WORK/s.json" "$WORK/again.json" <<'PY' && ok "the written manifest plans to the winner's tokens/s" ||
import json, sys
a = json.load(open(sys.argv[1]))["layouts"][0]
b = json.load(open(sys.argv[2]))["layouts"][0]
assert b["knobs"] == a["knobs"], (a["knobs"], b["knobs"])
assert abs(a["tokens_per_s_per_gpu"] - b["tokens_per_s_per_gpu"]) <= 1e-9 * a["tokens_per_s_per_gpu"], (a, b)
PY
    fail "the written manifest plans differently"
else
    fail "plan of the written manifest: $(head -c 300 "$WORK/err")"
fi

# the shipped knobs: async TP (tp's) and float8's switch, under their keys, on a search that tunes them
if "$CTITAN" plan configs/llama3_1b.yaml --hardware h100-sxm --gpus 8 --search --top 20 --json >"$WORK/b.json" 2>"$WORK/err"; then
    python3 - "$WORK/b.json" <<'PY' && ok "the shipped knobs: async TP where tp > 1 (on in some), float8's switch on every layout and the guide's" ||
import json, sys
d = json.load(open(sys.argv[1]))
ls = d["layouts"]
for l in ls:
    k, p = l["knobs"], l["parallelism"]
    assert k.get("quantize.dense.float8.enable") in ("true", "false"), k
    assert (k.get("quantize.dense.float8.enable") == "true") == l["float8"]["enable"], (k, l["float8"])
    assert ("compile.enable_async_tensor_parallel" in k) == (p["tensor_parallel_degree"] > 1), (k, p)
    assert ("parallelism.context_parallel_rotate_method" in k) == (p["context_parallel_degree"] > 1), (k, p)
assert any(l["knobs"].get("compile.enable_async_tensor_parallel") == "true" for l in ls), "async TP never on"
g = d["guide"]["layout"] # the guide's rule up to 10B: float8 on, through the quantizer's switch
assert g["float8"]["enable"] and g["knobs"].get("quantize.dense.float8.enable") == "true", g
PY
    fail "the shipped knobs in JSON"
else
    fail "plan --search of Llama 3 1B exited $?: $(head -c 300 "$WORK/err")"
fi

# tp's knob is the later spelling, which wins when given: parallelism.enable_async_tensor_parallel=true
# under compile.enable_async_tensor_parallel=false plans as no async TP, and alone as async TP
tpplan() { # NAME ARGS...: the layout's step time and hidden comm seconds into $WORK/NAME
    local name=$1
    shift
    "$CTITAN" plan configs/llama3_1b.yaml --hardware h100-sxm --gpus 2 --parallelism.tensor_parallel_degree=2 "$@" \
        --json >"$WORK/$name.json" 2>"$WORK/err" &&
        python3 -c 'import json,sys; l=json.load(open(sys.argv[1]))["layouts"][0]; print(l["step_time_s"], l["time_s"]["comm_hidden"])' \
            "$WORK/$name.json" >"$WORK/$name"
}
if tpplan off && tpplan on --compile.enable_async_tensor_parallel=true &&
    tpplan old --parallelism.enable_async_tensor_parallel=true &&
    tpplan both --parallelism.enable_async_tensor_parallel=true --compile.enable_async_tensor_parallel=false; then
    if cmp -s "$WORK/off" "$WORK/both" && cmp -s "$WORK/on" "$WORK/old" && ! cmp -s "$WORK/off" "$WORK/on"; then
        ok "async TP: the later spelling wins when given (step s, hidden s: off $(cat "$WORK/off"), on $(cat "$WORK/on"))"
    else fail "async TP spellings: off $(cat "$WORK/off"), on $(cat "$WORK/on"), older alone $(cat "$WORK/old"), both $(cat "$WORK/both")"; fi
else
    fail "plan with tp 2: $(head -c 300 "$WORK/err")"
fi

# a knob list naming an option the plugin lacks is refused at load, in one line
bad=$WORK/ctitan-knobbad.so
if cc $PC -DKNOBCHECK_BAD_KNOB -std=c11 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden -o "$bad" \
    tests/plugins/knobcheck.c; then
    "$CTITAN" plan configs/llama3_debug.yaml --hardware h100-sxm --gpus 2 --parallelism.cp_strategy="$bad" \
        >"$WORK/out" 2>"$WORK/err"
    rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$WORK/err")" -eq 1 ] && grep -qF "search knob 'knobcheck_missing'" "$WORK/err" &&
        grep -qF "cp_strategy" "$WORK/err"; then
        ok "a knob naming no option: $(cut -c1-160 "$WORK/err")"
    else fail "a knob naming no option: status $rc: $(head -3 "$WORK/err")"; fi
else
    fail "cannot build the bad knobcheck variant"
fi

[ $fails -eq 0 ] && echo "plan_knobs: all passed" || echo "plan_knobs: $fails failed"
[ $fails -eq 0 ]
