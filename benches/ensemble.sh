#!/usr/bin/env bash
# Ensemble benchmark (issue 5), in one run:
#   ident / ens3    - one call of a trivial ONNX model (Identity, FP32 [4]) against an ensemble of
#                     three such steps, on mesh-node (Triton's build here has no ONNX backend);
#   add_sub / ens_py2 - Triton's Python add_sub example alone and a 2-step ensemble of it
#                     (OUTPUT0 of the first is INPUT0 of the second), the same files on mesh-node
#                     and on real Triton 2.51.
# All driven by the same perf_analyzer over gRPC. Output: markdown on stdout and in
# benches/results/ensemble-<host>.md. Needs scripts/setup.sh.
source "$(dirname "$0")/common.sh"
OUT=benches/results/ensemble-$(hostname).md
R=$WORK/repo
mkdir -p "$R/ens_py2/1" "$R/ident/1" "$R/ens3/1"
write_add_sub "$R"
IO=$ADD_SUB_IO
map() { printf 'input_map { key: "%s" value: "%s" } ' "$@"; }
cat > "$R/ens_py2/config.pbtxt" <<EOF2
name: "ens_py2"
platform: "ensemble"
$IO
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "add_sub" model_version: -1 $(map INPUT0 INPUT0) $(map INPUT1 INPUT1) output_map { key: "OUTPUT0" value: "sum" } },
  { model_name: "add_sub" model_version: -1 $(map INPUT0 sum) $(map INPUT1 INPUT1) output_map { key: "OUTPUT0" value: "OUTPUT0" } }
] }
EOF2
cp -r "$R" "$WORK/triton-repo" && rm -rf "$WORK/triton-repo/ident" "$WORK/triton-repo/ens3"
.venv/bin/python - "$R/ident/1/model.onnx" <<'PY'
import sys
import onnx
from onnx import TensorProto, helper
io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [4])
graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "ident", [io("x")], [io("y")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.save(model, sys.argv[1])
PY
printf 'name: "ident"\nbackend: "onnxruntime"\n' > "$R/ident/config.pbtxt"
step() { printf '{ model_name: "ident" model_version: -1 input_map { key: "x" value: "%s" } output_map { key: "y" value: "%s" } }' "$1" "$2"; }
cat > "$R/ens3/config.pbtxt" <<EOF2
name: "ens3"
platform: "ensemble"
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ $(step x t1), $(step t1 t2), $(step t2 y) ] }
EOF2

{
echo "# Ensembles: mesh-node vs Triton 2.51, $(date -u +%F), $(nproc) vCPU $(lscpu | sed -n 's/Model name: *//p' | head -1)"
echo
echo "| model | concurrency | server | infer/s | p50 µs | p99 µs |"
echo "|---|---|---|---|---|---|"
"$BIN" --model-repository "$R" --http-port 28700 --grpc-port 28701 --metrics-port 28702 \
  --backend-config "python,interpreter=$PWD/.venv/bin/python" >"$WORK/node.log" 2>&1 &
NODE=$!
wait_live 28700
for p in "ident 1" "ens3 1" "ident 8" "ens3 8" "add_sub 1" "ens_py2 1" "ens_py2 8"; do
  set -- $p; measure mesh 28701 "$1" "$2"
done | tee "$WORK/mesh.md"
kill $NODE; wait $NODE 2>/dev/null || true
"$PEERS/bin/tritonserver" --model-repository "$WORK/triton-repo" --http-port 28800 --grpc-port 28801 \
  --metrics-port 28802 >"$WORK/triton.log" 2>&1 &
TRITON=$!
wait_live 28800
for p in "add_sub 1" "ens_py2 1" "ens_py2 8"; do
  set -- $p; measure triton 28801 "$1" "$2"
done | tee "$WORK/triton.md"
kill $TRITON; wait $TRITON 2>/dev/null || true
echo
.venv/bin/python - "$WORK/mesh.md" "$WORK/triton.md" <<'PY'
import sys
rows = lambda p: {(l.split("|")[1].strip(), l.split("|")[2].strip()): l.split("|")[4:7] for l in open(p) if l.startswith("|")}
m, t = rows(sys.argv[1]), rows(sys.argv[2])
p50 = lambda r, k: float(r[k][1])
for c in ("1", "8"):
    print(f"- mesh, c={c}: each step past the first adds {(p50(m, ('ens3', c)) - p50(m, ('ident', c))) / 2:.0f} µs p50 "
          f"(ens3 {p50(m, ('ens3', c)):.0f} µs against one ident call {p50(m, ('ident', c)):.0f} µs)")
for c in ("1", "8"):
    print(f"- 2-step Python ensemble, c={c}: mesh p50 / Triton p50 = {p50(m, ('ens_py2', c)) / p50(t, ('ens_py2', c)):.2f}, "
          f"throughput mesh / Triton = {float(m[('ens_py2', c)][0]) / float(t[('ens_py2', c)][0]):.2f}x")
print(f"- one Python add_sub call, c=1: mesh p50 / Triton p50 = {p50(m, ('add_sub', '1')) / p50(t, ('add_sub', '1')):.2f}")
PY
} | tee "$OUT"
