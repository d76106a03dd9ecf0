#!/usr/bin/env bash
# nanoplan report: one self-contained HTML file (nothing fetched), with the memory figure of every
# pipeline stage, the plan strip, the layer options and the sweep; with --run, the measured memory
# too. Then rendered by headless Chromium (tools/setup installs it): the screenshot is not blank,
# the page logs no console error (a page that does is caught, as a control), and the rendered DOM
# holds the figures. Bad input: no -o, an unwritable path (nothing left behind).
# Usage: bash tests/cli_report.sh /path/to/nanoplan
# shellcheck source=tests/cli_lib.sh
source "$(dirname "$0")/cli_lib.sh" "$1"

R=(report --model llama-3.1-8b --tp 2 --pp 2 --pp-schedule 1f1b --microbatches 4 --seq-len 8192 --gpu h100)
"$NP" "${R[@]}" --sweep-gpus 8 -o "$TMP/r.html" 2>"$TMP/r.err"; rc=$?
check "report exits 0 and says what it wrote" '[ $rc -eq 0 ] && grep -q "wrote $TMP/r.html" "$TMP/r.err"'
check "the figures: a memory figure per stage, the plan strip, the layer options, the sweep" \
  'grep -q "id=\"memory-stage-0\"" "$TMP/r.html" && grep -q "id=\"memory-stage-1\"" "$TMP/r.html" && grep -q "id=\"plan-strip\"" "$TMP/r.html" && grep -q "id=\"frontier\"" "$TMP/r.html" && grep -q "<table id=\"sweep\">" "$TMP/r.html"'
check "the step time and the sweep say which GPU and what overlap their times are of" \
  '[ "$(grep -c "on h100-sxm-80gb, no communication overlapped with compute" "$TMP/r.html")" -eq 2 ]'
check "self-contained: no script, nothing fetched" \
  '! grep -qiE "<script|https?://|src=|@import|url\(" "$TMP/r.html"'
check "the verdict and the peak are in it" 'grep -q "id=\"verdict\"" "$TMP/r.html" && grep -q "FITS" "$TMP/r.html" && grep -q "peak " "$TMP/r.html"'

write_tiny_model "$TMP/tiny.toml"
"$NP" report --model "$TMP/tiny.toml" --tp 2 --pp 2 --pp-schedule 1f1b --microbatches 2 --seq-len 8 \
  --budget 1MiB --run -o "$TMP/run.html" 2>"$TMP/run.err"; rc=$?
check "report --run draws the measured memory of every stage" \
  '[ $rc -eq 0 ] && [ "$(grep -c "class=\"measured\"" "$TMP/run.html")" -eq 2 ]'
check "a tiny model's memory axis in KiB, not a flat GiB one" \
  'grep -q "text-anchor=\"middle\">KiB</text>" "$TMP/run.html" && ! grep -q "text-anchor=\"middle\">GiB</text>" "$TMP/run.html"'
check "a large model's memory axis in GiB" 'grep -q "text-anchor=\"middle\">GiB</text>" "$TMP/r.html"'

"$NP" report --model llama-3.1-8b >"$TMP/no.out" 2>"$TMP/no.err"; rc=$?
check "report without -o: exit 2, one line" '[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/no.err")" -eq 1 ]'
"$NP" "${R[@]}" -o "$TMP/missing-dir/r.html" >"$TMP/nw.out" 2>"$TMP/nw.err"; rc=$?
check "an unwritable path: exit 2, nothing left behind" \
  '[ $rc -eq 2 ] && grep -q "cannot write" "$TMP/nw.err" && [ ! -e "$TMP/missing-dir" ]'

# Headless Chromium.
CHROME=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$CHROME" ]; then
  fail "headless Chromium not found (tools/setup installs the Debian package chromium)"
  finish
fi
render() {  # render HTML PNG LOG: a screenshot and the console log
  timeout 120 "$CHROME" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
    --user-data-dir="$TMP/chrome-profile" --enable-logging=stderr --v=0 --window-size=1100,2400 \
    --screenshot="$2" "file://$1" >"$3" 2>&1
}
console_errors() { grep -E "CONSOLE|Uncaught" "$1" | grep -ciE "error|uncaught" || true; }
render "$TMP/r.html" "$TMP/r.png" "$TMP/r.log"
check "Chromium renders the report" '[ -s "$TMP/r.png" ] || { tail -5 "$TMP/r.log"; false; }'
python3 - "$TMP/r.png" <<'PY' && ok "the screenshot is not blank: drawn pixels, several colours" || fail "the screenshot is blank"
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n"
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and ctype in (2, 6), (depth, ctype)
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw, stride, prev, rows = zlib.decompress(idat), w * bpp, bytearray(w * bpp), []
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        p = a + b - c
        pred = [0, a, b, (a + b) // 2, a if abs(p - a) <= abs(p - b) and abs(p - a) <= abs(p - c) else (b if abs(p - b) <= abs(p - c) else c)][f]
        line[i] = (line[i] + pred) & 255
    rows.append(line)
    prev = line
drawn, colours = 0, set()
for line in rows[::4]:
    for x in range(0, stride, bpp * 4):
        px = tuple(line[x:x + 3])
        colours.add(px)
        drawn += min(px) < 235
total = (h // 4) * (w // 4)
assert drawn > 0.03 * total and len(colours) > 8, (drawn, total, len(colours))
PY
check "no console errors" '[ "$(console_errors "$TMP/r.log")" -eq 0 ] || grep -E "CONSOLE|Uncaught" "$TMP/r.log"'
# The control: a page that logs an error is caught by the same check.
printf '<!DOCTYPE html><html><body><p>x</p><script>console.error("control error"); undefined_function();</script></body></html>\n' >"$TMP/bad.html"
render "$TMP/bad.html" "$TMP/bad.png" "$TMP/bad.log"
check "the console check catches a page with errors (control)" '[ "$(console_errors "$TMP/bad.log")" -gt 0 ]'
timeout 120 "$CHROME" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$TMP/chrome-profile" \
  --dump-dom "file://$TMP/r.html" >"$TMP/dom.html" 2>/dev/null
check "the rendered DOM holds the figures" \
  '[ "$(grep -o "<svg class=\"figure" "$TMP/dom.html" | wc -l)" -eq 4 ] && grep -q "plan-strip" "$TMP/dom.html"'
finish
