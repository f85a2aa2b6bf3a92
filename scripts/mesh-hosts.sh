#!/usr/bin/env bash
# Runs the mesh on separate "hosts" of this machine: one router and N nodes (default 3), each in its
# own network namespace with its own address on a bridge (the harness of tests/netns.py), joined over
# QUIC with mutual TLS. The router places configs/example-repo's models on the empty nodes (two
# replicas each); once every model is ready the script prints the router's address (reachable from
# this machine), example curl / mesh-ops commands and how to kill, freeze or partition a host, then
# waits. Ctrl-C or SIGTERM stops the nodes (they drain), the router, and deletes every namespace it
# made (all named with its own prefix). Needs root; run scripts/setup.sh once first.
#   sudo scripts/mesh-hosts.sh [--nodes N] [--model-repository DIR] [--check] [--help]
# The work is done by scripts/mesh_hosts.py (which the namespace tests use too).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
exec "$PY" scripts/mesh_hosts.py "$@"
