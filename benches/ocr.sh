#!/usr/bin/env bash
# OCR pipeline benchmark: the ensemble `ocr` next to `ocr_bls` (the same five PP-OCRv4 steps called
# through BLS), both from configs/example-repo, driven by perf_analyzer over gRPC at concurrency 1
# and 4 with one rendered PNG (two lines of text) as the UINT8 `image` input. A model that is not
# ready (the ensemble, before the mesh runs ensembles) gets a row saying so.
# Output: markdown on stdout and in benches/results/ocr-<host>.md. Needs scripts/setup.sh.
# Usage: benches/ocr.sh [SECONDS_PER_POINT]
DEFAULT_SECS=5
source "$(dirname "$0")/common.sh"
OUT=benches/results/ocr-$(hostname).md
[ -f configs/example-repo/ocr_rec/1/model.onnx ] || { echo "run scripts/setup.sh first" >&2; exit 1; }
mkdir -p "$WORK/data"
# perf_analyzer reads a non-string input from a file named after it: the PNG's bytes, shape [len].
.venv/bin/python - "$WORK/data/image" <<'PY'
import sys
from PIL import Image, ImageDraw, ImageFont
font = ImageFont.truetype("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", 32)
img = Image.new("RGB", (480, 160), "white")
draw = ImageDraw.Draw(img)
draw.text((24, 24), "The quick brown fox", fill="black", font=font)
draw.text((24, 81), "jumps over 13 lazy dogs", fill="black", font=font)
img.save(sys.argv[1], "PNG")
PY
SIZE=$(stat -c %s "$WORK/data/image")

"$BIN" --model-repository configs/example-repo --http-port 28600 --grpc-port 28601 --metrics-port 28602 \
  --backend-config "python,interpreter=$PWD/.venv/bin/python" ${MESH_ARGS:-} >"$WORK/node.log" 2>&1 &
for _ in $(seq 120); do curl -sf localhost:28600/v2/models/ocr_bls/ready >/dev/null && break; sleep 0.5; done
sleep 2  # let the ensemble settle (ready or failed)

measure() {  # model concurrency
  if ! curl -sf "localhost:28600/v2/models/$1/ready" >/dev/null; then
    echo "| $1 | $2 | not ready: $(curl -s -X POST localhost:28600/v2/repository/index | .venv/bin/python -c \
      "import json,sys; print(next((r.get('reason','?') for r in json.load(sys.stdin) if r['name']=='$1'), '?'))") | | | |"
    return
  fi
  rm -f "$WORK/pa.csv"
  "$PEERS/bin/perf_analyzer" -m "$1" -u localhost:28601 -i grpc --concurrency-range "$2" \
    --input-data "$WORK/data" --shape "image:$SIZE" \
    --measurement-interval $((SECS * 1000)) --stability-percentage 25 -f "$WORK/pa.csv" >"$WORK/pa.log" 2>&1 || true
  .venv/bin/python - "$WORK/pa.csv" "$1" "$2" <<'PY' || echo "| $1 | $2 | perf_analyzer failed (see its log) | | | |"
import csv, sys
r = list(csv.DictReader(open(sys.argv[1])))[-1]
ms = lambda us: f"{int(r[us]) / 1000:.1f}"
print(f"| {sys.argv[2]} | {sys.argv[3]} | ok | {float(r['Inferences/Second']):.1f} | {ms('p50 latency')} | {ms('p99 latency')} |")
PY
}

read_text() {  # model
  .venv/bin/python - "$WORK/data/image" "$1" <<'PY'
import sys
import numpy as np
import tritonclient.grpc as g
c = g.InferenceServerClient("localhost:28601")
if not c.is_model_ready(sys.argv[2]):
    sys.exit(0)
x = np.fromfile(sys.argv[1], np.uint8)
t = g.InferInput("image", [x.size], "UINT8")
t.set_data_from_numpy(x)
print(f"- `{sys.argv[2]}` reads: {[s.decode() for s in c.infer(sys.argv[2], [t]).as_numpy('text')]}")
PY
}

{
echo "# OCR pipeline (PP-OCRv4): ensemble vs BLS on mesh-node, $(date -u +%F), $(nproc) vCPU $(lscpu | sed -n 's/Model name: *//p' | head -1)"
echo
echo "Input: a ${SIZE}-byte PNG, 480x160, two lines of text; perf_analyzer over gRPC, ${SECS} s windows."
echo
read_text ocr_bls
read_text ocr
echo
echo "| model | concurrency | status | infer/s | p50 ms | p99 ms |"
echo "|---|---|---|---|---|---|"
for m in ocr ocr_bls; do for c in 1 4; do measure "$m" "$c"; done; done
} | tee "$OUT"
