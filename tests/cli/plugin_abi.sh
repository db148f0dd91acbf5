#!/usr/bin/env bash
# The loader holds plugins to the ABI version: a plugin built against another major (ABI 1.5) or a
# newer minor than the host's is refused with one line naming the file and both versions (exit 2);
# one of the host's version loads. Arrays of ABI structs are checked too: an option list whose
# struct_size is wrong, and a schedule that overwrites its actions' struct_size, are refused by name.
# The test plugins are real .so files built here from the SDK through pkg-config.
set -u
CTITAN=${CTITAN:-build/ctitan}; BUILD=${BUILD:-build}
case $CTITAN in /*) ;; *) CTITAN=$(pwd)/$CTITAN ;; esac
. tests/cli/lib/common.sh
test_tmp
counting_fails
# expect NAME STATUS PATTERN... -- CMD...: CMD exits STATUS with one stderr line matching every PATTERN
expect() {
  local name=$1 want=$2; shift 2; local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done; shift
  "$@" >"$T/out" 2>"$T/err"; local rc=$? lines ok=1; lines=$(wc -l <"$T/err")
  [ "$rc" -eq "$want" ] && [ "$lines" -eq 1 ] || ok=0
  for p in "${pats[@]}"; do grep -qE -- "$p" "$T/err" || ok=0; done
  if [ $ok -eq 1 ]; then echo "ok   $name: $(cat "$T/err")"
  else fail "$name: status $rc (wanted $want), $lines stderr lines, wanted /${pats[*]}/:"; sed 's/^/     /' "$T/err" | head -5; fi
}
MAJ=$(sed -n 's/^#define CT_ABI_MAJOR \([0-9]*\).*/\1/p' sdk/include/ctitan/abi.h)
MIN=$(sed -n 's/^#define CT_ABI_MINOR \([0-9]*\).*/\1/p' sdk/include/ctitan/abi.h)
[ -n "$MAJ" ] && [ -n "$MIN" ] || { echo "FAIL cannot read CT_ABI_MAJOR / CT_ABI_MINOR from abi.h"; exit 1; }
PC=$(PKG_CONFIG_PATH="$BUILD" pkg-config --cflags ctitan-sdk) || { echo "FAIL no $BUILD/ctitan-sdk.pc"; exit 1; }

# A GPipe-like schedule whose entry reports ABI VMAJ.VMIN. BAD_ACTIONS: writes out[k] whole (zeroing
# struct_size); BAD_OPTIONS=1: an option list whose first struct_size is 0; =2: a middle entry's differs.
cat >"$T/sched.c" <<'C'
#include "ctitan/schedule.h"
static ct_status acts(const ct_host *h, const ct_schedule_shape *s, ct_pp_action *out, int cap, int *n) {
    (void)h;
    int m = s->n_microbatches, k = 0;
    *n = 2 * m;
    if (cap < 2 * m) return CT_ERR_INVALID;
    for (int i = 0; i < 2 * m; i++) {
#ifdef BAD_ACTIONS
        out[k++] = (ct_pp_action){.op = i < m ? CT_PP_F : CT_PP_B, .stage = s->rank, .microbatch = i % m};
#else
        ct_pp_action *a = CT_AT(ct_pp_action, out, k++);
        a->op = i < m ? CT_PP_F : CT_PP_B, a->stage = s->rank, a->microbatch = i % m;
#endif
    }
    return CT_OK;
}
static const ct_schedule_api api = {sizeof api, CT_PP_LOOP, 1, 1, acts};
#if BAD_OPTIONS == 1
static const ct_option_spec opts[] = {{0, "x", CT_OPT_INT, "1", "x"}, {0}};
#elif BAD_OPTIONS == 2
static const ct_option_spec opts[] = {{sizeof(ct_option_spec), "x", CT_OPT_INT, "1", "x"},
                                      {sizeof(ct_option_spec) + 8, "y", CT_OPT_INT, "1", "y"}, {0}};
#else
static const ct_option_spec opts[] = {{sizeof(ct_option_spec), "x", CT_OPT_INT, "1", "x"}, {0}};
#endif
CT_EXPORT ct_status ctitan_plugin_entry(const ct_host *h, ct_plugin_info *info) {
    (void)h;
    info->abi_major = VMAJ; info->abi_minor = VMIN; /* what a plugin built against that SDK reports */
    info->kind = CT_KIND_SCHEDULE; info->name = "AbiProbe"; info->options = opts; info->api = &api;
    return CT_OK;
}
C
build() { cc $PC -shared -o "$T/$1.so" "$T/sched.c" "${@:2}" || fail "cannot build $1.so"; }
build v1 -DVMAJ=1 -DVMIN=5
build newer -DVMAJ=CT_ABI_MAJOR "-DVMIN=(CT_ABI_MINOR + 1)"
build same -DVMAJ=CT_ABI_MAJOR -DVMIN=CT_ABI_MINOR
build overwrite -DVMAJ=CT_ABI_MAJOR -DVMIN=CT_ABI_MINOR -DBAD_ACTIONS
build opt0 -DVMAJ=CT_ABI_MAJOR -DVMIN=CT_ABI_MINOR -DBAD_OPTIONS=1
build optmix -DVMAJ=CT_ABI_MAJOR -DVMIN=CT_ABI_MINOR -DBAD_OPTIONS=2
run=(schedule --pp 2 --microbatches 2 --name)

expect "ABI 1.5 plugin" 2 "^ctitan schedule: .*/v1\.so: built against ctitan ABI 1\.5; this host speaks ABI $MAJ\.$MIN: rebuild it against this SDK \(pkg-config ctitan-sdk\)$" \
  -- "$CTITAN" "${run[@]}" "$T/v1.so"
expect "newer minor" 2 "/newer\.so: built against ctitan ABI $MAJ\.$((MIN+1)), newer than the ABI $MAJ\.$MIN this host speaks" "rebuild" \
  -- "$CTITAN" "${run[@]}" "$T/newer.so"
"$CTITAN" "${run[@]}" "$T/same.so" >"$T/out" 2>&1 && grep -q '^AbiProbe: pp 2' "$T/out" \
  && echo "ok   ABI $MAJ.$MIN plugin loads and its schedule checks" || fail "the ABI $MAJ.$MIN plugin: $(head -3 "$T/out")"
expect "actions' struct_size overwritten" 2 "schedule AbiProbe broke its contract for rank 0: it overwrote action 0's struct_size" "CT_AT" \
  -- "$CTITAN" "${run[@]}" "$T/overwrite.so"
expect "option list with struct_size 0" 2 "/opt0\.so: option list's first entry has struct_size 0" "sizeof\(ct_option_spec\)" \
  -- "$CTITAN" "${run[@]}" "$T/opt0.so"
expect "option entries of mixed sizes" 2 "/optmix\.so: option 'y' has struct_size [0-9]+ and the list's first entry [0-9]+" \
  -- "$CTITAN" "${run[@]}" "$T/optmix.so"

# through a manifest the line also says where the plugin was named
cp "$T/v1.so" "$T/old_model.so"
printf 'model:\n  name: ./old_model.so\n' >"$T/model.yaml"
expect "ABI 1.5 plugin named in a manifest" 2 "model.yaml:2" "model.name" "old_model\.so: built against ctitan ABI 1\.5; this host speaks ABI $MAJ\.$MIN" \
  -- "$CTITAN" train "$T/model.yaml"
# and `ctitan plugins` lists it as refused, with the host's version on top
mkdir "$T/dir" && cp "$T/v1.so" "$T/dir/ctitan-old.so" && cp "$T/same.so" "$T/dir/ctitan-probe.so"
"$CTITAN" plugins "$T/dir" >"$T/list" 2>&1
grep -q "^host ABI $MAJ\.$MIN " "$T/list" && grep -qE "^\? +ctitan-old\.so .*built against ctitan ABI 1\.5" "$T/list" \
  && grep -qE "^schedule +AbiProbe +$MAJ\.$MIN " "$T/list" && echo "ok   ctitan plugins: host ABI $MAJ.$MIN, the 1.5 one refused" \
  || fail "ctitan plugins: $(head -6 "$T/list")"
[ "$("$CTITAN" --version)" = "ctitan: plugin ABI $MAJ.$MIN" ] && echo "ok   ctitan --version says ABI $MAJ.$MIN" \
  || fail "ctitan --version: $("$CTITAN" --version 2>&1)"
[ $fails -eq 0 ] && echo "plugin_abi: ok" || { echo "plugin_abi: $fails failed"; exit 1; }
