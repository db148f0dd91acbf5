#!/usr/bin/env bash
# `ctitan plot`: four real tiny runs (one rank fp32, FSDP 2 bf16, FSDP 2 x TP 2 bf16, float8 rowwise;
# made by scripts/make_readme_plot.sh, which draws docs/observability.md's PNG) and hand-made metrics.jsonl
# files (a resumed run, validation records). The SVG parses as XML with one stroked path per run and
# the legend's glyphs; the PNG has its signature, the asked size, many colours and every run's
# colour; labels come from the start records' layouts (or --label); a resumed run plots the last
# value per step; --x tokens counts each start's tokens per step; nested fields and validation_loss
# plot; bad input (no metrics.jsonl, a field no record has, a malformed line, bad options) exits 2
# with one line naming the folder, file or field.
set -u
CTITAN=${CTITAN:-build/ctitan}
. tests/cli/lib/common.sh
test_tmp

# 1. docs/observability.md's picture from real runs (the script keeps them for the checks below)
CTITAN=$CTITAN KEEP="$T/runs" scripts/make_readme_plot.sh "$T/readme.png" >"$T/readme.log" 2>&1 ||
  { tail -5 "$T/readme.log"; fail "scripts/make_readme_plot.sh"; }
R=$T/runs
for l in '"1 rank, fp32"' '"dp_shard 2, bf16"' '"dp_shard 2, tp 2, bf16"' '"1 rank, float8 rowwise"'; do
  grep -q "^plot: .*: $l, 40 points, steps 1..40, tokens 512..20480, loss " "$T/readme.log" ||
    { cat "$T/readme.log"; fail "no run labelled $l with 40 points and 512 tokens per step"; }
done
echo "ok   the README plot's runs are labelled by layout: 1 rank, fp32 / dp_shard 2, bf16 / dp_shard 2, tp 2, bf16 / float8 rowwise"

# png_check FILE W H NRUNS: signature, IHDR size, many colours, each palette colour's pixels
png_check() {
  python3 - "$@" <<'EOF'
import struct, sys, zlib
path, w, h, nruns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
data = open(path, 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n', 'no PNG signature'
pos, idat, ihdr = 8, b'', None
while pos < len(data):
    n, kind = struct.unpack('>I4s', data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b'IHDR': ihdr = struct.unpack('>IIBBBBB', body)
    if kind == b'IDAT': idat += body
    pos += 12 + n
W, H, depth, ctype = ihdr[:4]
assert (W, H) == (w, h), f'size {W}x{H}, asked {w}x{h}'
assert depth == 8 and ctype in (2, 6), f'depth {depth} colour type {ctype}'
bpp = 3 if ctype == 2 else 4
raw, stride, rows, prev = zlib.decompress(idat), W * bpp, [], bytearray(W * bpp)
for y in range(H):  # undo the PNG row filters
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line); prev = line
px = {}
for line in rows:
    for x in range(W):
        k = tuple(line[x * bpp:x * bpp + 3]); px[k] = px.get(k, 0) + 1
assert len(px) > 20, f'only {len(px)} colours: blank?'
palette = [(0, 114, 178), (213, 94, 0), (0, 158, 115), (204, 121, 167)][:nruns]
for col in palette:
    n = sum(v for k, v in px.items() if all(abs(k[i] - col[i]) <= 1 for i in range(3)))
    assert n >= 80, f'colour {col}: {n} pixels'
white = px.get((255, 255, 255), 0)
print(f'{W}x{H}, {len(px)} colours, white {100 * white // (W * H)}%')
EOF
}
out=$(png_check "$T/readme.png" 720 400 4) || fail "README PNG: $out"
echo "ok   README PNG: $out; each run's colour present"

# 2. SVG of three runs: XML, one stroked path per run colour, the legend's glyphs
"$CTITAN" plot "$R/one" "$R/fsdp" "$R/fsdp_tp" --output "$T/a.svg" --title "three layouts" >"$T/svg.log" 2>&1 ||
  { cat "$T/svg.log"; fail "svg"; }
out=$(python3 - "$T/a.svg" <<'EOF'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag.endswith('svg') and root.get('width').startswith('800') and root.get('height').startswith('500'), root.attrib
paths = [e for e in root.iter() if e.tag.endswith('path')]
def stroked(rgb):
    return [p for p in paths if f'stroke:{rgb}' in (p.get('style') or '') and 'stroke-width:2;' in p.get('style')]
for rgb in ('rgb(0%,44.7%,69.8%)', 'rgb(83.5%,36.9%,0%)', 'rgb(0%,62%,45.1%)'):
    assert len(stroked(rgb)) == 1, f'{rgb}: {len(stroked(rgb))} curves'
uses = [e for e in root.iter() if e.tag.endswith('use')]
want = sum(len(s.replace(' ', '')) for s in ('1 rank, fp32', 'dp_shard 2, bf16', 'dp_shard 2, tp 2, bf16', 'three layouts'))
assert len(uses) >= want, f'{len(uses)} glyphs drawn, the labels and title alone have {want}'
print(f'{len(paths)} paths, {len(uses)} glyphs')
EOF
) || fail "SVG: $out"
echo "ok   SVG parses as XML: $out; one curve per run"

# 3. options: nested field, log scale, smoothing, labels, steps; duplicate labels get their folder
"$CTITAN" plot "$R/one" "$R/float8" --metric memory.peak_bytes --log-y --smooth 0.6 --size 400x300 \
  --label "one rank" --output "$T/mem.png" >"$T/mem.log" 2>&1 || { cat "$T/mem.log"; fail "memory.peak_bytes"; }
grep -q "^plot: $R/one: \"one rank\", 40 points, steps 1..40, memory.peak_bytes " "$T/mem.log" &&
  grep -q "^plot: $R/float8: \"1 rank, float8 rowwise\"" "$T/mem.log" || { cat "$T/mem.log"; fail "--label"; }
out=$(png_check "$T/mem.png" 400 300 2) || fail "memory PNG: $out"
"$CTITAN" plot "$R/one" "$R/one" --output "$T/dup.svg" >"$T/dup.log" 2>&1 &&
  grep -q "\"1 rank, fp32 ($R/one)\"" "$T/dup.log" || { cat "$T/dup.log"; fail "duplicate labels"; }
echo "ok   --metric memory.peak_bytes --log-y --smooth --size --label (PNG $out); equal labels name their folders"

# 4. hand-made files: a resumed run (a later start re-logs step 3 with 200 tokens per step) and validation
mkdir -p "$T/resumed" "$T/old" "$T/bad" "$T/neg" "$T/empty"
rec() { echo "{$1, \"time\": \"2026-01-01T00:00:00Z\", \"run_id\": \"x\"}"; }
{ rec '"event": "start", "first_step": 1, "steps": 4, "world_size": 1, "tokens_per_step": 100, "layout": {"pp": 1, "dp_replicate": 2, "dp_shard": 1, "cp": 1, "tp": 1, "param_dtype": "bfloat16", "float8": null}'
  rec '"step": 1, "loss": 5, "memory": {"peak_bytes": 10}'
  rec '"event": "validation", "step": 1, "validation_loss": 5.5'
  rec '"step": 2, "loss": 4, "memory": {"peak_bytes": 10}'
  rec '"step": 3, "loss": 9, "memory": {"peak_bytes": 10}'
  rec '"event": "start", "first_step": 3, "steps": 4, "world_size": 2, "tokens_per_step": 200, "layout": {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1, "param_dtype": "float32", "float8": "mxfp8"}'
  rec '"step": 3, "loss": 3, "memory": {"peak_bytes": 10}'
  rec '"step": 4, "loss": 2, "memory": {"peak_bytes": 10}'
  rec '"event": "validation", "step": 4, "validation_loss": 2.5'
  rec '"event": "end", "last_step": 4'; } >"$T/resumed/metrics.jsonl"
"$CTITAN" plot "$T/resumed" --x tokens --output "$T/r.svg" >"$T/r.log" 2>&1 &&
  grep -qx "plot: $T/resumed: \"pp 2, float8 mxfp8\", 4 points, steps 1..4, tokens 100..600, loss 5 -> 2" "$T/r.log" ||
  { cat "$T/r.log"; fail "resumed run"; }
echo "ok   a resumed run: the last value per step (step 3: 3, not 9), tokens 100..600 across 100 and 200 per step, the last start's layout"
"$CTITAN" plot "$T/resumed" "$R/one" --metric validation_loss --output "$T/v.png" >"$T/v.log" 2>"$T/v.err"
rc=$?
[ $rc -eq 2 ] && grep -q "^ctitan plot: $R/one/metrics.jsonl: no record has a numeric \"validation_loss\" (records with a step have: step, loss, grad_norm, lr, tps, tflops, mfu, memory.\*, comm_bytes.\*, time, run_id)$" "$T/v.err" ||
  { cat "$T/v.err"; fail "a field one run lacks: status $rc"; }
"$CTITAN" plot "$T/resumed" --metric validation_loss --output "$T/v.png" >"$T/v.log" 2>&1 &&
  grep -q "2 points, steps 1..4, validation_loss 5.5 -> 2.5" "$T/v.log" || { cat "$T/v.log"; fail "validation_loss"; }
echo "ok   --metric validation_loss plots the validation records; a run without them: exit 2 naming the file and the fields it has"

mkdir -p "$T/diverged"
{ rec '"step": 1, "loss": 5, "grad_norm": 1'; rec '"step": 2, "loss": nan, "grad_norm": -inf'; rec '"step": 3, "loss": 4, "grad_norm": 2'; } \
  >"$T/diverged/metrics.jsonl"
"$CTITAN" plot "$T/diverged" --output "$T/d.svg" >"$T/d.log" 2>&1 &&
  grep -qx "plot: $T/diverged/metrics.jsonl:2: \"loss\" is not finite at step 2; left out" "$T/d.log" &&
  grep -q "2 points, steps 1..3, loss 5 -> 4" "$T/d.log" || { cat "$T/d.log"; fail "a nan loss"; }
echo "ok   a diverged run's nan (printf's word, not JSON) is read, left out and said so"

# 5. bad input: exit 2 (1 for an unwritable output), one line naming what is wrong
{ rec '"event": "start", "first_step": 1, "steps": 2, "world_size": 1'; rec '"step": 1, "loss": 2'; } >"$T/old/metrics.jsonl"
{ rec '"step": 1, "loss": 2'; echo '{"step": 2, "loss": '; } >"$T/bad/metrics.jsonl"
{ rec '"step": 1, "loss": 2'; rec '"step": 2, "loss": 0'; } >"$T/neg/metrics.jsonl"
refuse() { # status "message" ctitan-plot-args...
  local want=$1 msg=$2; shift 2
  "$CTITAN" plot "$@" >/dev/null 2>"$T/err"
  local rc=$?
  [ $rc -eq "$want" ] && grep -qF -- "$msg" "$T/err" && [ "$(wc -l <"$T/err")" -eq 1 ] ||
    { cat "$T/err"; fail "plot $*: status $rc (want $want and '$msg')"; }
  echo "ok   plot ${*:1:3}...: exit $want: $(cut -c1-110 "$T/err")"
}
refuse 2 "ctitan plot: $T/empty: no metrics.jsonl" "$T/empty" --output "$T/x.svg"
refuse 2 "ctitan plot: $T/nothere: not a folder" "$T/nothere" --output "$T/x.svg"
refuse 2 "$R/one/metrics.jsonl: no record has a numeric \"nope.deeper\"" "$R/one" --metric nope.deeper --output "$T/x.svg"
refuse 2 "$R/one/metrics.jsonl:2: \"run_id\" is not a number" "$R/one" --metric run_id --output "$T/x.svg"
refuse 2 "$T/bad/metrics.jsonl:2: not a JSON object" "$T/bad" --output "$T/x.svg"
refuse 2 "$T/old/metrics.jsonl:2: --x tokens: no start record before it gives tokens_per_step" "$T/old" --x tokens --output "$T/x.svg"
refuse 2 "$T/neg/metrics.jsonl: --log-y: \"loss\" is 0 at step 2" "$T/neg" --log-y --output "$T/x.svg"
refuse 2 "--output: the name must end in .svg or .png: $T/x.pdf" "$R/one" --output "$T/x.pdf"
refuse 2 "--output FILE.svg or FILE.png is required" "$R/one"
refuse 2 "name at least one run folder" --output "$T/x.svg"
refuse 2 "--x: want step or tokens, not time" "$R/one" --x time --output "$T/x.svg"
refuse 2 "--size: want WxH, 240x180 to 8000x8000, not 100x100" "$R/one" --size 100x100 --output "$T/x.svg"
refuse 2 "--smooth: want a weight in [0, 1), not 1" "$R/one" --smooth 1 --output "$T/x.svg"
refuse 2 "more --label options than run folders; the extra one is b" "$R/one" --label a --label b --output "$T/x.svg"
refuse 2 "unknown option --colour" "$R/one" --colour red --output "$T/x.svg"
refuse 2 "missing the value of --metric" "$R/one" --output "$T/x.svg" --metric
refuse 1 "ctitan plot: cannot write $T/no/such/x.png" "$R/one" --output "$T/no/such/x.png"
[ ! -e "$T/x.svg" ] && [ -z "$(find "$T" -maxdepth 1 -name '*.tmp.*')" ] || fail "a refused plot left a file"
"$CTITAN" plot --help | grep -q "^usage: ctitan plot RUN_DIR... --output FILE.svg|FILE.png" || fail "plot --help"
"$CTITAN" --help | grep -q "^  plot RUN_DIR... " || fail "ctitan --help lists no plot"
echo "ok   plot --help; ctitan --help lists plot"
