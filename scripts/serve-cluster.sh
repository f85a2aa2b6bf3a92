#!/usr/bin/env bash
# Sets everything up, then runs a cluster on this machine: mesh-router (HTTP :8000, gRPC :8001,
# metrics :8002, cluster port UDP :8003) with configs/example-repo as the cluster repository, and
# two mesh-nodes (node-a, node-b) started without a repository that join it over QUIC with mutual
# TLS. The router ships every model to both nodes (two replicas each) and runs the OCR ensemble
# itself. Clients talk to the router exactly as to one server. Certificates are made once by
# `mesh-ops certs` in .cluster/certs; shipped files are cached in .cluster/cache-<node>. Ctrl-C
# stops the router and both nodes (the nodes drain first).
# With --ha: a local etcd (:2379, data in .cluster/etcd) and a second router (HTTP :8010, gRPC
# :8011, metrics :8012, cluster UDP :8013); both nodes join both routers, and the routers elect the
# one that places through etcd. Kill either router: the other keeps serving and takes placement over.
#   scripts/serve-cluster.sh [--ha]     # then: target/release/mesh-ops status (or models)
set -euo pipefail
cd "$(dirname "$0")/.."
HA=0
[ "${1:-}" = "--ha" ] && HA=1
scripts/setup.sh
BIN=target/release
CERTS=.cluster/certs
[ -f "$CERTS/ca.pem" ] || "$BIN/mesh-ops" certs init "$CERTS"
# Leaf certificates are cheap: issued afresh on each start, each with its role.
"$BIN/mesh-ops" certs issue "$CERTS" router --role router --force >/dev/null
for name in node-a node-b; do "$BIN/mesh-ops" certs issue "$CERTS" "$name" --role node --force >/dev/null; done
tls() { echo --cluster-ca "$CERTS/ca.pem" --cluster-cert "$CERTS/$1.pem" --cluster-key "$CERTS/$1.key"; }
mkdir -p .cluster/logs
ETCD_PID=
# Nodes and routers stop first (a leader hands its lease back to etcd), then etcd.
stop() {
  kill -TERM $(jobs -p | grep -vx "${ETCD_PID:-none}") 2>/dev/null
  wait $(jobs -p | grep -vx "${ETCD_PID:-none}") 2>/dev/null
  [ -n "$ETCD_PID" ] && kill -TERM "$ETCD_PID" 2>/dev/null
  wait
}
trap stop EXIT INT TERM
joins=(--cluster-join 127.0.0.1:8003)
if [ "$HA" = 1 ]; then
  etcd --name mesh --data-dir .cluster/etcd --listen-client-urls http://127.0.0.1:2379 \
    --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
    >.cluster/logs/etcd.log 2>&1 &
  ETCD_PID=$!
  ha=(--etcd-endpoints http://127.0.0.1:2379)
  "$BIN/mesh-router" --model-repository configs/example-repo $(tls router) "${ha[@]}" --router-name router-1 &
  "$BIN/mesh-router" --model-repository configs/example-repo $(tls router) "${ha[@]}" --router-name router-2 \
    --http-port 8010 --grpc-port 8011 --metrics-port 8012 --cluster-port 8013 >.cluster/logs/router-2.log 2>&1 &
  joins+=(--cluster-join 127.0.0.1:8013)
else
  "$BIN/mesh-router" --model-repository configs/example-repo $(tls router) &
fi
port=8100
for node in node-a node-b; do
  "$BIN/mesh-node" --cluster-cache ".cluster/cache-$node" \
    --backend-config "python,interpreter=$PWD/.venv/bin/python" \
    --http-port $port --grpc-port $((port + 1)) --metrics-port $((port + 2)) \
    --node-name "$node" "${joins[@]}" $(tls "$node") >".cluster/logs/$node.log" 2>&1 &
  port=$((port + 100))
done
echo "router on :8000 (HTTP) / :8001 (gRPC); nodes log to .cluster/logs/; try: $BIN/mesh-ops status"
[ "$HA" = 1 ] && echo "second router on :8010 / :8011 (log .cluster/logs/router-2.log); etcd on :2379"
wait
