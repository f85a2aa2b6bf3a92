#!/usr/bin/env bash
# Builds the mesh's container image (configs/container/Containerfile) as localhost/mesh:latest with
# Debian's podman, then smoke-tests it from inside its own root:
#
#   scripts/build-image.sh [--tag TAG] [--no-smoke | --smoke-only]
#
# - the base is a debootstrap minbase root imported with `podman import` (scripts/debian-base.sh; no
#   image registry is reachable here), as localhost/mesh-base:bookworm;
# - `podman build --isolation chroot`, the build stage given the host's Rust toolchain read-only,
#   cargo's download cache, a build cache in $MESH_IMAGE_CACHE (default /var/cache/mesh-image,
#   outside the repository), and the machine's CA bundle for PyPI;
# - smoke test: `podman run` cannot start containers on this VM (setrlimit RLIMIT_NPROC is refused),
#   so the image's root is mounted (`podman image mount`), bound read-only with tmpfs /tmp and
#   /dev/shm as the manifests give it, and its binaries run there by chroot as uid 65532 in a network
#   namespace with only loopback: mesh-node serves an ONNX model (the example's MLP) and a Python
#   model using numpy, checked with tritonclient, and joins a mesh-router from the image (mutual
#   TLS with certificates from the image's mesh-ops) that routes the MLP to it.
# Installs Debian's podman when missing (as root). Needs root and the project venv (scripts/setup.sh
# makes it, and the example's models).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
argv=("$@")
tag=localhost/mesh:latest
smoke=1
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --no-smoke) smoke=0; shift ;;
    --smoke-only) build=0; shift ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "build-image: needs root (podman import/build/mount, chroot)" >&2; exit 2; }
if [ -z "${MESH_IMAGE_NS:-}" ]; then
  MESH_IMAGE_NS=1 exec unshare --mount --propagation private -- "$0" "${argv[@]}"
fi
say() { echo "build-image: $*"; }
t0=$(date +%s)
lap() { say "$1 ($(( $(date +%s) - t0 )) s so far)"; }

if ! command -v podman >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends podman >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends podman >/dev/null; }
fi

base=localhost/mesh-base:bookworm
if ! podman image exists "$base"; then
  tar=$("$repo/scripts/debian-base.sh")
  podman import --quiet "$tar" "$base" >/dev/null
  lap "imported $base from $tar"
fi

cache=${MESH_IMAGE_CACHE:-/var/cache/mesh-image}
rustup=${RUSTUP_HOME:-$HOME/.rustup}
cargo=${CARGO_HOME:-$HOME/.cargo}
ca=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
install -d -m 0700 "$cache/target"
mkdir -p "$cargo/registry"
[ "$build" = 1 ] && podman build --isolation chroot --layers=false -f "$repo/configs/container/Containerfile" -t "$tag" \
  --build-arg "BASE=$base" \
  --volume "$rustup:/root/.rustup:ro" --volume "$cargo/bin:/root/.cargo/bin:ro" \
  --volume "$cargo/registry:/root/.cargo/registry" --volume "$cache/target:/cache/target" \
  --volume "$ca:/etc/ssl/host-ca.crt:ro" --build-arg PIP_CERT=/etc/ssl/host-ca.crt \
  "$repo"
lap "$([ "$build" = 1 ] && echo built || echo using) $tag ($(podman image inspect "$tag" --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}'))"
[ "$smoke" = 1 ] || exit 0

# --- smoke test, from inside the image's own root -----------------------------------------------
py=$repo/.venv/bin/python
mlp=$repo/configs/example-repo/mlp
if [ ! -x "$py" ] || [ ! -f "$mlp/1/model.onnx" ]; then "$repo/scripts/setup.sh"; fi
work=$(mktemp -d "${TMPDIR:-/var/tmp}/mesh-image.XXXXXX")
root=$work/root
mnt=""
# shellcheck source=scripts/root-lib.sh
. "$repo/scripts/root-lib.sh"
cleanup() {
  local rc=$?
  set +e
  local left
  left=$(release_root "$root")
  [ -n "$mnt" ] && podman image unmount "$tag" >/dev/null
  [ "$left" = 0 ] && rm -rf --one-file-system "$work"
  if [ $rc = 0 ]; then say "PASSED: $tag served from its own root ($(( $(date +%s) - t0 )) s in all)"
  else say "FAILED (exit $rc) after $(( $(date +%s) - t0 )) s; logs were in $work"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mnt=$(podman image mount "$tag")
mkdir -p "$root" "$work/models/mlp" "$work/models/py_sum/1"
mount --bind "$mnt" "$root" && mount -o remount,bind,ro "$root"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
mount -t tmpfs -o mode=1777,nosuid,nodev shm "$root/dev/shm"
mount -t tmpfs -o mode=1777,nosuid,nodev tmp "$root/tmp"
# A repository of an ONNX model and a Python model that needs numpy, mounted read-only at /models
# (the image has no /models: mounted on its /mnt).
cp -r "$mlp/." "$work/models/mlp/"
cat >"$work/models/py_sum/config.pbtxt" <<'PBTXT'
backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "s" data_type: TYPE_FP32 dims: [ 1 ] } ]
PBTXT
cat >"$work/models/py_sum/1/model.py" <<'PY'
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            s = np.sum(x, axis=1, keepdims=True).astype(np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("s", s)]))
        return out
PY
chmod -R a+rX "$work/models"
mount --bind "$work/models" "$root/mnt" && mount -o remount,bind,ro "$root/mnt"
if touch "$root/usr/local/bin/.w" 2>/dev/null; then echo "build-image: the root is writable" >&2; exit 1; fi

export root work py tag
unshare --net -- bash -c '
  set -e
  ip link set lo up
  as_mesh() { chroot --userspec=65532:65532 "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp \
    ORT_DYLIB_PATH=$(podman image inspect "$tag" --format "{{range .Config.Env}}{{println .}}{{end}}" | sed -n "s/^ORT_DYLIB_PATH=//p") "$@"; }
  # Cluster certificates made by the image'"'"'s own mesh-ops, in its tmpfs /tmp.
  as_mesh /usr/local/bin/mesh-ops certs init /tmp/certs >/dev/null
  as_mesh /usr/local/bin/mesh-ops certs issue /tmp/certs router --role router --ip 127.0.0.1 >/dev/null
  as_mesh /usr/local/bin/mesh-ops certs issue /tmp/certs node --role node >/dev/null
  tls() { echo --cluster-ca /tmp/certs/ca.pem --cluster-cert /tmp/certs/$1.pem --cluster-key /tmp/certs/$1.key; }
  as_mesh /usr/local/bin/mesh-router $(tls router) --http-port 8010 --grpc-port 8011 --metrics-port 8012 \
    --cluster-address 127.0.0.1 --cluster-port 8013 >"$work/router.log" 2>&1 &
  router=$!
  as_mesh /usr/local/bin/mesh-node --model-repository /mnt --node-name node $(tls node) \
    --cluster-join 127.0.0.1:8013 >"$work/node.log" 2>&1 &
  node=$!
  rc=0
  "$py" - <<"PYCHECK" || rc=$?
import time, urllib.request
import numpy as np
import tritonclient.http as httpclient

def wait(url, what):
    end = time.monotonic() + 60
    while True:
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > end:
            raise SystemExit(f"smoke: {what} did not answer {url} within 60 s")
        time.sleep(0.3)

wait("http://127.0.0.1:8000/v2/health/ready", "mesh-node")
c = httpclient.InferenceServerClient("127.0.0.1:8000")
for m in ("mlp", "py_sum"):
    assert c.is_model_ready(m), m
x = np.arange(8, dtype=np.float32).reshape(2, 4)
i = httpclient.InferInput("x", [2, 4], "FP32"); i.set_data_from_numpy(x)
s = c.infer("py_sum", [i]).as_numpy("s")
assert s.tolist() == [[6.0], [22.0]], s
m = httpclient.InferInput("x", [1, 64], "FP32"); m.set_data_from_numpy(np.ones((1, 64), np.float32))
y = c.infer("mlp", [m]).as_numpy("y")
assert y.shape == (1, 16) and np.isfinite(y).all(), y
print("smoke: mesh-node from the image serves mlp (ONNX Runtime) and py_sum (Python, numpy)")
wait("http://127.0.0.1:8010/v2/models/mlp/ready", "mesh-router (mlp routed to the node)")
r = httpclient.InferenceServerClient("127.0.0.1:8010")
m = httpclient.InferInput("x", [1, 64], "FP32"); m.set_data_from_numpy(np.ones((1, 64), np.float32))
assert np.array_equal(r.infer("mlp", [m]).as_numpy("y"), y)
print("smoke: mesh-router from the image routes mlp to the node that joined it (mutual TLS)")
PYCHECK
  kill -TERM $node $router 2>/dev/null || true
  wait $node $router 2>/dev/null || true
  if [ $rc != 0 ]; then echo "--- node.log"; tail -n 30 "$work/node.log"; echo "--- router.log"; tail -n 30 "$work/router.log"; fi
  exit $rc
'
