#!/usr/bin/env bash
# Sets everything up, then runs a cluster on this machine: mesh-router (HTTP :8000, gRPC :8001,
# metrics :8002, cluster port UDP :8003) with configs/example-repo as the cluster repository, and
# two mesh-nodes (node-a, node-b) started without a repository that join it over QUIC with mutual
# TLS. The router ships every model to both nodes (two replicas each) and runs the OCR ensemble
# itself. Clients talk to the router exactly as to one server. Certificates are made once by
# `mesh-ops certs` in .cluster/certs; shipped files are cached in .cluster/cache-<node>. Ctrl-C
# stops the router and both nodes (the nodes drain first).
#   scripts/serve-cluster.sh            # then: target/release/mesh-ops status (or models)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BIN=target/release
CERTS=.cluster/certs
if [ ! -f "$CERTS/ca.pem" ]; then
  "$BIN/mesh-ops" certs init "$CERTS"
  for name in router node-a node-b; do "$BIN/mesh-ops" certs issue "$CERTS" "$name" >/dev/null; done
fi
tls() { echo --cluster-ca "$CERTS/ca.pem" --cluster-cert "$CERTS/$1.pem" --cluster-key "$CERTS/$1.key"; }
mkdir -p .cluster/logs
trap 'kill -TERM $(jobs -p) 2>/dev/null; wait' EXIT INT TERM
"$BIN/mesh-router" --model-repository configs/example-repo $(tls router) &
port=8100
for node in node-a node-b; do
  "$BIN/mesh-node" --cluster-cache ".cluster/cache-$node" \
    --backend-config "python,interpreter=$PWD/.venv/bin/python" \
    --http-port $port --grpc-port $((port + 1)) --metrics-port $((port + 2)) \
    --node-name "$node" --cluster-join 127.0.0.1:8003 $(tls "$node") >".cluster/logs/$node.log" 2>&1 &
  port=$((port + 100))
done
echo "router on :8000 (HTTP) / :8001 (gRPC); nodes log to .cluster/logs/; try: $BIN/mesh-ops status"
wait
