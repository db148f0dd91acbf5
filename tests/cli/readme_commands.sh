#!/usr/bin/env bash
# Every command in the fenced ``` blocks of README.md and docs/*.md runs and exits 0, as written: a
# command added to the docs that breaks fails this test. Commands are read from the docs themselves:
#   - `build/ctitan ...`, `mpirun ...`, `make ...`, `cc ...` lines (with `\` continuations);
#     build/ is $BUILD (the sanitizer build under SANITIZE=1);
#   - train runs get overrides APPENDED only: a tiny dataset and tokenizer made here, 3 steps of
#     seq 32, an 8-token sample, one thread, their own dump folder (debugmodel_moe also 2 blocks of 8
#     experts); configs/sft_* runs (train and
#     generate) get one thread and one dump folder of their own, and read the shards the docs'
#     tokenize commands wrote before them;
#   - synopsis lines (placeholders such as MANIFEST.yaml, [--option], a|b, ...) run `ctitan CMD --help`;
#   - `make demo`, `make test`, `make bench`, `make fuzz` are skipped: minutes of training, the
#     whole suite this test is part of, the benchmark, the fuzzers;
#   - a pipeline into ctitan (`PRODUCER ... | build/ctitan ...`) runs as written; one that reads a
#     Parquet file is skipped, saying so: the user's file, read with DuckDB or Python (tests run no
#     Python), and one whose producer is not installed is skipped naming it.
# mpirun as root needs Open MPI's allow-run-as-root and oversubscribe switches: set through its
# environment variables, so the command line stays as written.
set -u
CTITAN=${CTITAN:-build/ctitan}; BUILD=${BUILD:-build}
. tests/cli/lib/common.sh
test_tmp
root=$(pwd)
. tests/cli/lib/data.sh
test_data "$T" 2048 || fail "test data"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# The commands of the docs' fenced blocks, one per line (continuations joined, comments cut).
awk '/^```/ { inb = !inb; next }
     inb { line = $0; sub(/^[ \t]+/, "", line)
           if (cont != "") { line = cont " " line; cont = "" }
           if (line ~ /\\$/) { sub(/[ \t]*\\$/, "", line); cont = line; next }
           sub(/[ \t]+#.*$/, "", line)
           if (line ~ /^(build\/ctitan|make|mpirun|cc|PKG_CONFIG_PATH=)/ || line ~ /\| *build\/ctitan /) print line }' README.md docs/*.md >"$T/commands"
n=$(wc -l <"$T/commands")
[ "$n" -ge 10 ] || fail "only $n commands found in the fenced blocks of README.md and docs/"

tiny=(--training.dataset_path="$T/data.bin" --model.tokenizer_path="$T/tok.model" --training.steps=3
      --training.seq_len=32 --generate.max_new_tokens=8 --device.threads=1 --metrics.log_freq=1)
fails=0; i=0
while IFS= read -r cmd; do
  i=$((i + 1))
  case "$cmd" in
    "make demo"*|"make test"*|"make bench"*|"make fuzz"*) echo "skip $cmd (minutes, or the suite itself)"; continue ;;
  esac
  run=${cmd//build\/ctitan/$CTITAN}
  if [[ "$cmd" =~ ^[^|]+\|\ *build/ctitan\  ]]; then # a pipeline into ctitan
    tool=${cmd%% *}
    if [[ "$cmd" == *.parquet* ]]; then echo "skip $cmd  (reads the user's Parquet file with $tool: no such file, DuckDB or Python here)"; continue; fi
    if ! command -v "$tool" >/dev/null; then echo "skip $cmd  ($tool is not installed)"; continue; fi
    if (set -o pipefail; eval "$run") >"$T/$i.log" 2>&1 </dev/null; then echo "ok   $cmd"
    else echo "FAIL $cmd: exit $?:"; tail -5 "$T/$i.log" | sed 's/^/     /'; fails=$((fails + 1)); fi
    continue
  fi
  if [[ "$cmd" =~ (MANIFEST|FILE|FOLDER|COMMAND|NAME|\[|\||\.\.\.) ]]; then # a synopsis: the command's help
    sub=$(sed -E 's/^build\/ctitan ([a-z]+).*/\1/' <<<"$cmd")
    if "$CTITAN" "$sub" --help >"$T/$i.log" 2>&1 </dev/null; then echo "ok   $cmd  (synopsis: ctitan $sub --help)"
    else echo "FAIL $cmd: ctitan $sub --help exited $?"; fails=$((fails + 1)); fi
    continue
  fi
  if [[ "$cmd" == *pkg-config* ]]; then # an out-of-tree plugin: the SDK template as my.c
    mkdir -p "$T/sdk$i" && cp sdk/template/lion.c "$T/sdk$i/my.c" && ln -s "$root/$BUILD" "$T/sdk$i/build"
    if (cd "$T/sdk$i" && eval "$cmd") >"$T/$i.log" 2>&1 </dev/null && [ -s "$T/sdk$i/my.so" ]; then echo "ok   $cmd"
    else echo "FAIL $cmd:"; tail -5 "$T/$i.log" | sed 's/^/     /'; fails=$((fails + 1)); fi
    continue
  fi
  extra=()
  # under the sanitizer build, LeakSanitizer's report at exit (Open MPI's own allocations among
  # them) turns a rank's status nonzero; `ctitan launch` reads the ranks' own status, raw mpirun
  # does not: leak checks are off for it, every other memory error still fails
  [[ "$cmd" == mpirun* ]] && run="ASAN_OPTIONS=\${ASAN_OPTIONS:+\$ASAN_OPTIONS:}detect_leaks=0 $run"
  [[ "$run" == *" train "* ]] && extra=("${tiny[@]}" --job.dump_folder="$T/run$i")
  # torchtitan's debugmodel_moe (8 blocks of 64 experts, 226M parameters) shrunk as the MoE tests shrink
  # it: 2 blocks of 8 experts of hidden 64, top-2 (the two docs commands took 190 s of this test)
  [[ "$run" == *" train "*debugmodel_moe* ]] &&
    extra+=(--model.n_layers=2 --model.n_experts=8 --model.top_k=2 --model.moe_hidden=64)
  # the fine-tuning manifest runs on the data its own doc commands made (20 short steps), and its
  # generate reads what its train wrote
  [[ "$run" == *configs/sft_* ]] && extra=(--device.threads=1 --job.dump_folder="$T/sft")
  if eval "$run" '"${extra[@]}"' >"$T/$i.log" 2>&1 </dev/null; then # mpirun would read the list
    echo "ok   $cmd  ($(grep -c '^step\|\] step' "$T/$i.log") step lines; sample: $(grep -A1 '^sample:\|\] sample:' "$T/$i.log" | tail -1 | cut -c1-50))"
  else
    echo "FAIL $cmd: exit $?:"; tail -5 "$T/$i.log" | sed 's/^/     /'; fails=$((fails + 1))
  fi
  grep -qi 'warning' "$T/$i.log" && { echo "FAIL $cmd: printed a warning:"; grep -i warning "$T/$i.log" | head -3; fails=$((fails + 1)); }
done <"$T/commands"
echo "$i README commands, $fails failed"
[ "$fails" -eq 0 ]
