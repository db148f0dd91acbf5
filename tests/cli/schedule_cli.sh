#!/usr/bin/env bash
# schedule_cli: `ctitan schedule` builds, checks and draws pipeline schedules: every spelling of a
# name reaches the same plugin, an unknown name lists the loadable ones, --svg and --write-csv write
# files, a broken CSV exits 1 naming the rank and the action, bad usage or input exits 2 with one
# line. Then the CSV fuzz target replays its seed corpus (plain cc, AddressSanitizer + UBSan).
set -uo pipefail
BUILD=${BUILD:-build}
CTITAN=${CTITAN:-$BUILD/ctitan}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok:   $*"; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# run EXPECTED_STATUS ARGS...: output in $WORK/out, errors in $WORK/err
run() {
    local want=$1 got
    shift
    "$CTITAN" schedule "$@" >"$WORK/out" 2>"$WORK/err"
    got=$?
    if [ "$got" != "$want" ]; then
        fail "ctitan schedule $* exited $got, expected $want"
        sed 's/^/    | /' "$WORK/err" | head -5
        return 1
    fi
    return 0
}
has() { grep -qF -- "$2" "$WORK/$1" || { fail "$3: '$2' not in $1:"; sed 's/^/    | /' "$WORK/$1" | head -8; }; }

help=$("$CTITAN" schedule --help 2>&1)
if ! grep -q -- "--microbatches" <<<"$help"; then
    echo "FAIL: ctitan has no 'schedule' command: core/main.c needs"
    echo '      if (!strcmp(cmd, "schedule")) return cmd_schedule(argc - 1, argv + 1);'
    exit 1
fi

# -- every spelling of Interleaved1F1B gives the same schedule
for name in interleave_1f1b interleaved_1f1b Interleaved1F1B INTERLEAVED-1F1B ScheduleInterleaved1F1B; do
    run 0 --name "$name" --pp 4 --microbatches 8 || continue
    has out "Interleaved1F1B: pp 4, 8 stages (2 per rank), 8 microbatches" "$name"
    cp "$WORK/out" "$WORK/out.$name"
done
cmp -s "$WORK/out.interleave_1f1b" "$WORK/out.Interleaved1F1B" && cmp -s "$WORK/out.interleaved_1f1b" "$WORK/out.Interleaved1F1B" \
    && ok "interleave_1f1b, interleaved_1f1b, Interleaved1F1B ... print the same schedule" \
    || fail "the spellings of Interleaved1F1B print different schedules"

# -- the textbook 1F1B and GPipe numbers at pp 4 x 8 microbatches: bubble 3/11, makespan 3 (8 + 3)
if run 0 --name 1F1B --pp 4 --microbatches 8; then
    has out "bubble 0.273  peak activations 4  makespan 33" "1F1B pp 4 x 8"
    [ "$(grep -c '^rank ' "$WORK/out")" = 4 ] || fail "1F1B pp 4: not 4 timeline rows"
    grep -q '^rank 3 .*F0 B0--- F1 B1---' "$WORK/out" || fail "1F1B rank 3 does not alternate F and B"
    ok "1F1B pp 4 x 8: bubble 0.273, peak 4, makespan 33"
fi
run 0 --name gpipe --stages 4 --microbatches 8 && has out "bubble 0.273  peak activations 8  makespan 33" "GPipe --stages 4"
# only --stages: ZBV has 2 stages per rank, so 8 stages is pp 4
run 0 --name zbv --stages 8 --microbatches 8 && has out "ZBVZeroBubble: pp 4, 8 stages (2 per rank)" "zbv --stages 8"
run 0 --name LoopedBFS --pp 2 --microbatches 4 && has out "LoopedBFS: pp 2, 4 stages" "LoopedBFS"
run 0 --name interleaved_zb --pp 2 --microbatches 4 && has out "InterleavedZeroBubble: pp 2" "interleaved_zb"
# DualPipeV (any spelling): warm-up forwards, then pairs of one chunk's F and the other's B, emitted F then B
# (rank 0: 0F7 then 7B3, 7F4 then 0B0), I and W in the cool-down; the same bubble as ZBV at F=1 B=2 I=W=1
for name in DualPipeV dual_pipe_v ScheduleDualPipeV; do
    run 0 --name "$name" --pp 4 --microbatches 8 || continue
    has out "DualPipeV: pp 4, 8 stages (2 per rank), 8 microbatches" "$name"
    has out "bubble 0.059  peak activations 9  makespan 51" "$name pp 4 x 8"
    grep -q '^rank 0 .* 0F7 7B3---- 7F4 0B0---- ' "$WORK/out" || fail "$name: rank 0 does not pair F and B"
    grep -q '^rank 0 .* 0I7 0W7$' "$WORK/out" || fail "$name: rank 0 does not end on I and W"
done
ok "DualPipeV pp 4 x 8: bubble 0.059, peak 9, makespan 51, F+B pairs"
# one stage mixes whole Bs (steady state) with I then W (warm-up turn and cool-down), per microbatch
if run 0 --name DualPipeV --pp 2 --microbatches 4 --write-csv "$WORK/dpv.csv"; then
    has dpv.csv "(V placement)" "DualPipeV --write-csv"
    grep -qx '0F0,0F1,0F2,3F0,3I0,3W0,3F1,0F3,3B1,3F2,0B0,3B2,3F3,0B1,3B3,0I2,0W2,0I3,0W3' "$WORK/dpv.csv" &&
        ok "DualPipeV pp 2 x 4, rank 0: PyTorch's order, stage 3's microbatch 0 as I and W, 1-3 as B" ||
        fail "DualPipeV pp 2 x 4 rank 0's order: $(sed -n 2p "$WORK/dpv.csv")"
fi
# costs are parameters: B as cheap as F gives GPipe 2 (m + p - 1)
run 0 --name gpipe --pp 4 --microbatches 8 --costs 1,1,1,1 && has out "makespan 22" "--costs 1,1,1,1"

# -- an unknown name lists what can be loaded
if run 2 --name NoSuchSchedule --pp 2 --microbatches 2; then
    for n in GPipe 1F1B Interleaved1F1B LoopedBFS InterleavedZeroBubble ZBVZeroBubble DualPipeV CSV; do
        has err "$n" "unknown name lists $n"
    done
    has err "unknown pipeline schedule 'NoSuchSchedule'" "unknown name"
    ok "an unknown name lists the loadable schedules"
fi

# -- --svg and --write-csv
if run 0 --name zbv --pp 2 --microbatches 4 --svg "$WORK/zbv.svg"; then
    [ "$(head -c 4 "$WORK/zbv.svg")" = "<svg" ] || fail "--svg: the file does not start with <svg"
    # one bar per action (2 ranks x 2 stages x 4 microbatches x F, I, W) plus the background and 4 legend squares
    bars=$(grep -o '<rect' "$WORK/zbv.svg" | wc -l)
    [ "$bars" = $((2 * 2 * 4 * 3 + 5)) ] || fail "--svg: $bars rects, expected $((2 * 2 * 4 * 3 + 5))"
    tail -n 1 "$WORK/zbv.svg" | grep -q '</svg>' || fail "--svg: no closing </svg>"
    ls "$WORK"/zbv.svg.tmp.* >/dev/null 2>&1 && fail "--svg left a temporary file"
    ok "--svg writes an SVG with one bar per action"
fi
# a shipped schedule written as CSV runs through the CSV plugin to the same numbers
if run 0 --name Interleaved1F1B --pp 2 --microbatches 4 --write-csv "$WORK/il.csv"; then
    want=$(tail -n 1 "$WORK/out")
    run 0 --name csv --csv "$WORK/il.csv" --pp 2 --stages 4 --microbatches 4 && has out "$want" "CSV round trip"
    ok "--write-csv round-trips through --csv ($want)"
fi

# -- broken CSVs: exit 1 with the rank and the action
printf '0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n' >"$WORK/deadlock.csv"
run 1 --csv "$WORK/deadlock.csv" --pp 2 --microbatches 2 &&
    has err "deadlock: rank 0 waits at 0B0 for 1B0 (rank 1), rank 1 waits at 1F1 for 0F1 (rank 0)" "deadlock CSV"
printf '# rank 0\n0F0,0F1,0B0,0B1\n# rank 1\n1F0,1B0,1F1\n' >"$WORK/missing.csv"
run 1 --name CSV --csv "$WORK/missing.csv" --pp 2 --microbatches 2 && has err "rank 1 never runs 1B1" "missing action"
printf '0F0,0F1,0B0,0B1\n1F0,0F1,1B0,1F1,1B1\n' >"$WORK/stage.csv"
run 1 --csv "$WORK/stage.csv" --pp 2 --microbatches 2 && has err "rank 1 runs 0F1, but stage 0 is held by rank 0" "wrong stage"
ok "broken CSVs exit 1 naming the rank and the action"
# a cell that is no action: bad input (2), with file:line:column
printf '0F0,0F1,0B0,0B1\n1F0, 1Q0,1F1,1B1\n' >"$WORK/cell.csv"
run 2 --csv "$WORK/cell.csv" --pp 2 --microbatches 2 && has err "cell.csv:2:6: rank 1: cell '1Q0'" "malformed cell"

# -- bad usage and refused shapes: exit 2, one line
run 2 --name 1F1B --pp 4 && has err "--microbatches is required" "no --microbatches"
run 2 --name 1F1B --microbatches 4 && has err "give --pp" "no --pp or --stages"
run 2 --name 1F1B --pp 0 --microbatches 4 && has err "--pp needs" "--pp 0"
run 2 --name 1F1B --pp 2 --microbatches 4 --frobnicate && has err "unknown argument --frobnicate" "unknown argument"
run 2 --name csv --pp 2 --microbatches 4 && has err "pipeline_parallel_schedule_csv" "csv without a file"
run 2 --name Interleaved1F1B --pp 4 --microbatches 9 && has err "rounds" "Interleaved1F1B with 9 microbatches on pp 4"
run 2 --name GPipe --pp 2 --stages 4 --microbatches 4 && has err "exactly 1 stage per rank" "GPipe with 2 stages per rank"
run 2 --name gpipe --pp 3 --stages 4 --microbatches 4 && has err "do not split evenly" "4 stages on 3 ranks"
run 2 --name DualPipeV --pp 4 --microbatches 7 &&
    has err "DualPipeV, pp 4 x 2 stages per rank, 7 microbatches: needs at least as many microbatches as stages (2 x pp = 8), got 7" \
        "DualPipeV with 7 microbatches on pp 4"
for f in err; do [ "$(wc -l <"$WORK/$f")" -le 1 ] || fail "a usage error printed more than one line"; done
run 0 --help && has out "--microbatches M" "--help"
ok "bad usage and refused shapes exit 2 with one line"

# -- the CSV fuzz target over its seed corpus and mutations of it (no libFuzzer needed)
CC=${CC:-cc}
mkdir -p "$BUILD/fuzz-replay"
san=(-g -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
# the target and its driver against the core library (sanitized in the sanitizer build)
if "$CC" -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Isdk/include -Icore "${san[@]}" \
    -o "$BUILD/fuzz-replay/fuzz_schedule_csv" tests/fuzz/fuzz_schedule_csv.c tests/fuzz/replay_main.c \
    "$BUILD/libctitan-core.a" -lyaml -lpcre2-8 -ljansson -lz -lzstd -lcairo -lfontconfig -ldl -lm -lpthread -lstdc++; then
    if "$BUILD/fuzz-replay/fuzz_schedule_csv" -m 300 tests/fuzz/corpus/schedule_csv >"$WORK/fuzz.log" 2>&1; then
        ok "fuzz_schedule_csv replays its corpus ($(ls tests/fuzz/corpus/schedule_csv | wc -l) seeds x 300 mutations)"
    else
        fail "fuzz_schedule_csv failed on its corpus:"
        tail -n 20 "$WORK/fuzz.log"
    fi
else
    fail "fuzz_schedule_csv does not build"
fi

[ $fails -eq 0 ] && echo "schedule_cli: ok" || echo "schedule_cli: $fails failure(s)"
exit $((fails != 0))
