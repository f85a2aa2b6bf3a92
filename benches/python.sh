#!/usr/bin/env bash
# Python backend benchmark (issue 4), in one run: the same model.py files served by mesh-node and by
# real Triton 2.51's Python backend, driven by the same perf_analyzer over gRPC:
#   add_sub  - Triton's python_backend add_sub example (FP32 [4] + [4]);
#   bls_x2   - a BLS model that calls add_sub twice per request (Triton's build has no ONNX backend,
#              so the called model is the Python add_sub on both servers).
# Output: markdown on stdout and in benches/results/python-<host>.md. Needs scripts/setup.sh.
# MESH_ARGS adds mesh-node flags (e.g. --backend-config python,spin-microseconds=0); SKIP_TRITON=1
# measures the mesh alone (for tuning; the recorded numbers always come from a full run).
source "$(dirname "$0")/common.sh"
mkdir -p "$WORK/repo/bls_x2/1"
OUT=benches/results/python-$(hostname).md
write_add_sub "$WORK/repo"
IO=$ADD_SUB_IO
printf 'name: "bls_x2"\nbackend: "python"\n%s\noutput [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\ninstance_group [ { kind: KIND_CPU } ]\n' \
  "$IO" > "$WORK/repo/bls_x2/config.pbtxt"
cat > "$WORK/repo/bls_x2/1/model.py" <<'PY'
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1")
            first = pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0"], inputs=[a, b]).exec()
            s = pb_utils.get_output_tensor_by_name(first, "OUTPUT0")
            second = pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0"],
                                               inputs=[pb_utils.Tensor("INPUT0", s.as_numpy()), b]).exec()
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(second, "OUTPUT0")]))
        return out
PY

.venv/bin/python benches/python_probe.py write "$WORK/repo"
cp -r "$WORK/repo" "$WORK/mesh-repo"  # Triton's build here has no ONNX backend: the ONNX target is mesh-only
.venv/bin/python benches/python_probe.py write "$WORK/mesh-repo" --onnx

{
echo "# Python backend: mesh-node vs Triton 2.51, $(date -u +%F), $(nproc) vCPU $(lscpu | sed -n 's/Model name: *//p' | head -1)"
echo
echo "| model | concurrency | server | infer/s | p50 µs | p99 µs |"
echo "|---|---|---|---|---|---|"
"$BIN" --model-repository "$WORK/mesh-repo" --http-port 28300 --grpc-port 28301 --metrics-port 28302 \
  --backend-config "python,interpreter=$PWD/.venv/bin/python" ${MESH_ARGS:-} >"$WORK/node.log" 2>&1 &
NODE=$!
wait_live 28300
points() { for c in 1 4 8; do echo "add_sub $c"; done; for c in 1 4 8; do echo "bls_x2 $c"; done; }
if [ "${SKIP_TRITON:-}" = 1 ]; then
  points | while read -r m c; do measure mesh 28301 "$m" "$c"; done
  .venv/bin/python benches/python_probe.py probe 28300 mesh add_sub add_sub_onnx
  .venv/bin/python benches/python_probe.py rss mesh $NODE
  # This block runs in the pipeline's subshell, whose children common.sh's trap does not see.
  kill $NODE 2>/dev/null || true; wait $NODE 2>/dev/null || true
  exit 0
fi
"$PEERS/bin/tritonserver" --model-repository "$WORK/repo" --http-port 28400 --grpc-port 28401 --metrics-port 28402 \
  >"$WORK/triton.log" 2>&1 &
TRITON=$!
wait_live 28400
# Both servers stay up and each point is measured on one, then at once on the other, so a slow
# spell of this shared VM falls on both (measured in halves, the ratios moved by up to 30 %).
points | while read -r m c; do
  measure mesh 28301 "$m" "$c" >> "$WORK/mesh.md"
  measure triton 28401 "$m" "$c" >> "$WORK/triton.md"
done
.venv/bin/python benches/python_probe.py probe 28300 mesh add_sub add_sub_onnx > "$WORK/probe.md"
.venv/bin/python benches/python_probe.py probe 28400 triton add_sub >> "$WORK/probe.md"
.venv/bin/python benches/python_probe.py rss mesh $NODE > "$WORK/rss.md"
.venv/bin/python benches/python_probe.py rss triton $TRITON >> "$WORK/rss.md"
kill $NODE $TRITON; wait $NODE $TRITON 2>/dev/null || true
paste -d'\n' "$WORK/mesh.md" "$WORK/triton.md"
echo
.venv/bin/python - "$WORK/mesh.md" "$WORK/triton.md" <<'PY'
import sys
rows = lambda p: [l.split("|")[1:-1] for l in open(p) if l.startswith("|")]
print("| model | concurrency | mesh / Triton throughput | Triton p50 / mesh p50 |")
print("|---|---|---|---|")
for m, t in zip(rows(sys.argv[1]), rows(sys.argv[2])):
    print(f"| {m[0].strip()} | {m[1].strip()} | {float(m[3]) / float(t[3]):.2f}x | {float(t[4]) / float(m[4]):.2f}x |")
PY
echo
echo "One blocking BLS exec() from inside execute(), timed in the calling model (300 calls):"
echo
echo "| server | target model | p50 µs | mean µs |"
echo "|---|---|---|---|"
cat "$WORK/probe.md"
echo
echo "Python stub processes once serving:"
echo
echo "| server | stubs | max RSS MB | mean RSS MB | mean PSS MB | mean private MB |"
echo "|---|---|---|---|---|---|"
cat "$WORK/rss.md"
} | tee "$OUT"
