#!/usr/bin/env bash
# The fresh-root check: does what a new user does on a fresh Debian 12 machine, in an empty Debian
# root made by debootstrap instead of on this machine, so that an install step the project forgot
# fails here and not on a newcomer's first minute.
#
#   scripts/check-fresh.sh [--without PKG]... [--keep] [--rev REV] [--then CMD]...
#
# 1. base root: a minbase Debian 12 root (debootstrap, from Debian's packages), cached as a tarball
#    in $MESH_FRESH_CACHE (default /var/cache/mesh-fresh, outside the repository) by
#    scripts/debian-base.sh;
# 2. prerequisites: only the README's list (PREREQS below; --without PKG leaves one out, to watch the
#    check fail), installed with apt-get inside the root; the host's Rust toolchain is mounted
#    read-only and the cargo download cache is shared (downloads, not installs);
# 3. network: the machine's own set-up (resolv.conf, hosts, extra CA certificates, pip's, apt's and
#    cargo's configuration, and the variables that point at them), which belongs to the machine;
# 4. set-up: a clean clone of REV (default HEAD) runs the README's set-up command, scripts/setup.sh;
# 5. serve: scripts/serve-example.sh in a network namespace of its own with only loopback, checked
#    with tritonclient by scripts/check_example.py (every model READY, one inference over HTTP and
#    over gRPC), then stopped;
# 6. then: each --then CMD in turn, run by bash from the clone in the root with the machine's
#    network, as a user would after set-up; a step named after the command's script. CI runs the
#    README's test command this way (`--then ./scripts/test-all.sh`: its own set-up, then every
#    suite), then clippy (`--then ./scripts/lint.sh`, which needs the libtorch the test command
#    installed).
# pip's download cache is shared with later runs (in $MESH_FRESH_CACHE/pip), as cargo's is:
# downloads, not installs. Mounts live in a private mount namespace; processes left in the root
# are killed and the mounts taken down on any exit, and the root is removed unless --keep. Needs
# root.
set -euo pipefail

# The README's prerequisites, exactly (its "Two commands for a fresh machine" section names them).
PREREQS=(ca-certificates python3 python3-venv gcc g++ libc6-dev)

repo=$(cd "$(dirname "$0")/.." && pwd)
argv=("$@")
rev=HEAD
keep=0
without=()
then_cmds=()
while [ $# -gt 0 ]; do
  case "$1" in
    --without) without+=("$2"); shift 2 ;;
    --keep) keep=1; shift ;;
    --rev) rev=$2; shift 2 ;;
    --then) then_cmds+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "check-fresh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for w in "${without[@]}"; do
  keep_list=()
  for p in "${PREREQS[@]}"; do [ "$p" = "$w" ] || keep_list+=("$p"); done
  [ ${#keep_list[@]} -lt ${#PREREQS[@]} ] || { echo "check-fresh: --without $w: not a prerequisite (${PREREQS[*]})" >&2; exit 2; }
  PREREQS=("${keep_list[@]}")
done

# shellcheck source=scripts/root-lib.sh
. "$repo/scripts/root-lib.sh"

[ "$(id -u)" = 0 ] || { echo "check-fresh: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
# Mounts made below vanish with this private mount namespace, whatever ends the script.
if [ -z "${MESH_FRESH_NS:-}" ]; then
  MESH_FRESH_NS=1 exec unshare --mount --propagation private -- "$0" "${argv[@]}"
fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/mesh-fresh.XXXXXX")
# The fresh root builds everything (debug with libtorch, release, the test models): about 30 GiB.
# Less free space fails late with "No space left on device"; say so first.
free_gib=$(( $(df -Pk "$work" | awk 'NR == 2 {print $4}') / 1048576 ))
if [ "$free_gib" -lt 30 ]; then
  echo "check-fresh: warning: $free_gib GiB free under $work; the fresh root's builds need about 30 GiB" >&2
fi
root=$work/root
logs=$work/logs
mkdir -p "$root" "$logs"
commit=$(git -C "$repo" rev-parse --verify "$rev^{commit}")

timings=()
current=""
step_pid=""
started=$(date +%s)
say() { echo "check-fresh: $*"; }

# Every process in the fresh root, then every mount under it (scripts/root-lib.sh); the root is
# deleted only once no mount is left under it.
cleanup() {
  local rc=$? left
  set +e
  [ -n "$step_pid" ] && kill -TERM "$step_pid" 2>/dev/null
  left=$(release_root "$root")
  if [ "$keep" = 1 ] || [ "$left" != 0 ]; then
    say "kept $work (root, logs)$([ "$left" != 0 ] && echo ": $left mounts still under it")"
  else
    if [ $rc != 0 ]; then
      # The steps' logs outlive a failure, for whoever reads why.
      kept=$(mktemp -d "${TMPDIR:-/var/tmp}/mesh-fresh-logs.XXXXXX")
      cp -r "$logs/." "$kept/" && say "the steps' logs are kept in $kept"
    fi
    rm -rf --one-file-system "$work"
  fi
  echo "check-fresh: steps (seconds):"
  printf '  %s\n' "${timings[@]}"
  if [ $rc = 0 ]; then
    say "PASSED in $(( $(date +%s) - started )) s: commit $commit on a fresh Debian 12 root with only: ${PREREQS[*]}"
  else
    say "FAILED at step '$current' (exit $rc) after $(( $(date +%s) - started )) s; prerequisites: ${PREREQS[*]}"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# step NAME COMMAND...: runs it with its output in logs/NAME.log, records the time, and on failure
# shows the log's end.
step() {
  local name=$1 t0 rc
  shift
  current=$name
  t0=$(date +%s)
  say "$name ..."
  # In the background, so that a signal runs the traps at once rather than after the step.
  set +e
  "$@" >"$logs/$name.log" 2>&1 &
  step_pid=$!
  wait $step_pid
  rc=$?
  step_pid=""
  set -e
  timings+=("$(printf '%-12s %5d' "$name" $(( $(date +%s) - t0 )))")
  if [ $rc != 0 ]; then
    echo "----- last lines of $logs/$name.log -----" >&2
    tail -n 40 "$logs/$name.log" >&2
    echo "-----" >&2
    return $rc
  fi
}

# Runs a command inside the root with a clean environment: what a login shell there would have, plus
# the machine's network variables.
in_root() {
  local envs=(HOME=/root LANG=C.UTF-8 TERM=dumb DEBIAN_FRONTEND=noninteractive
    PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
  local v
  for v in SSL_CERT_FILE SSL_CERT_DIR PIP_CERT REQUESTS_CA_BUNDLE CURL_CA_BUNDLE GIT_SSL_CAINFO \
    GRPC_DEFAULT_SSL_ROOTS_FILE_PATH CARGO_HTTP_CAINFO PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST \
    PIP_DEFAULT_TIMEOUT PIP_DISABLE_PIP_VERSION_CHECK PIP_CONFIG_FILE http_proxy https_proxy no_proxy \
    HTTP_PROXY HTTPS_PROXY NO_PROXY RUSTUP_TOOLCHAIN; do
    [ -n "${!v:-}" ] && envs+=("$v=${!v}")
  done
  # IN_ROOT_EXEC=1: the calling (sub)shell becomes the chroot, so its pid is the command's.
  ${IN_ROOT_EXEC:+exec} chroot "$root" /usr/bin/env -i "${envs[@]}" "$@"
}

base_root() {
  local tar
  tar=$("$repo/scripts/debian-base.sh")
  tar -C "$root" -xf "$tar"
}

# The machine's network set-up, copied in: it is how this machine reaches the registries, not an install.
network() {
  cp -L /etc/resolv.conf "$root/etc/resolv.conf"
  cp /etc/hosts "$root/etc/hosts"
  grep -qw localhost "$root/etc/hosts" || printf '127.0.0.1 localhost\n::1 localhost ip6-localhost\n' >>"$root/etc/hosts"
  if compgen -G '/usr/local/share/ca-certificates/*' >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
  fi
  local f
  for f in /etc/apt/apt.conf.d/*; do
    [ -e "$root$f" ] || cp "$f" "$root$f"
  done
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/" && rm -f "$root/etc/apt/sources.list"
  fi
  for f in /etc/pip.conf "${PIP_CONFIG_FILE:-}" "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf" \
    "${CARGO_HOME:-$HOME/.cargo}/config.toml" "${CARGO_HOME:-$HOME/.cargo}/config"; do
    [ -n "$f" ] && [ -f "$f" ] || continue
    local to=$f
    case "$f" in "${CARGO_HOME:-$HOME/.cargo}"/*) to=/root/.cargo/${f##*/} ;; "$HOME"/*) to=/root/${f#"$HOME"/} ;; esac
    mkdir -p "$root$(dirname "$to")" && cp "$f" "$root$to"
  done
}

mounts() {
  # The root is a mount point of its own, as a real machine's is: `ip netns` (the fault tests'
  # hosts) makes "/" a slave mount, which fails on a plain directory.
  mount --bind "$root" "$root"
  mount -t proc proc "$root/proc"
  mount -t sysfs -o ro sysfs "$root/sys"
  mount --bind /dev "$root/dev"
  mount -t tmpfs -o mode=1777,nosuid,nodev shm "$root/dev/shm"
  mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts" 2>/dev/null || true
  # The host's Rust toolchain, read-only, and its download caches, shared.
  local rustup=${RUSTUP_HOME:-$HOME/.rustup} cargo=${CARGO_HOME:-$HOME/.cargo} d
  mkdir -p "$root/root/.rustup" "$root/root/.cargo/bin" "$root/root/.cargo/registry"
  mount --bind "$rustup" "$root/root/.rustup" && mount -o remount,bind,ro "$root/root/.rustup"
  mount --bind "$cargo/bin" "$root/root/.cargo/bin" && mount -o remount,bind,ro "$root/root/.cargo/bin"
  mkdir -p "$cargo/registry"
  mount --bind "$cargo/registry" "$root/root/.cargo/registry"
  # pip's downloads (wheels, HTTP cache), kept for the next run.
  local pip_cache=${MESH_FRESH_CACHE:-/var/cache/mesh-fresh}/pip
  install -d -m 0700 "$pip_cache"
  mkdir -p "$root/root/.cache/pip"
  mount --bind "$pip_cache" "$root/root/.cache/pip"
  for d in git; do
    [ -d "$cargo/$d" ] && mkdir -p "$root/root/.cargo/$d" && mount --bind "$cargo/$d" "$root/root/.cargo/$d"
  done
  true
}

prerequisites() {
  in_root apt-get update -q
  in_root apt-get install -y -q --no-install-recommends "${PREREQS[@]}"
  if [ -x "$root/usr/sbin/update-ca-certificates" ]; then in_root update-ca-certificates; fi
  in_root cargo --version
}

clone() {
  git clone --quiet --no-hardlinks --no-checkout "$repo" "$root/src"
  git -C "$root/src" checkout --quiet --detach "$commit"
}

# The README's set-up command, as a user runs it from the clone.
setup() {
  in_root bash -c 'cd /src && ./scripts/setup.sh'
}

# The README's serve command with only loopback, checked from the same namespace with tritonclient.
# The inner bash gets in_root and its variables exported.
serve() {
  unshare --net -- bash -c '
    set -e
    ip link set lo up
    (IN_ROOT_EXEC=1 in_root bash -c "cd /src && exec ./scripts/serve-example.sh" >"$logs/serve-example.log" 2>&1) &
    server=$!
    rc=0
    in_root bash -c "cd /src && exec .venv/bin/python scripts/check_example.py --wait 300" || rc=$?
    kill -TERM $server 2>/dev/null || true
    for _ in $(seq 50); do kill -0 $server 2>/dev/null || break; sleep 0.2; done
    if kill -0 $server 2>/dev/null; then echo "serve: mesh-node did not stop on SIGTERM within 10 s"; rc=1; fi
    echo "----- serve-example.log (last lines) -----"; tail -n 20 "$logs/serve-example.log"
    exit $rc
  '
}
# One --then command, from the clone, with the machine's network (the test command's set-up installs
# PyTorch, TensorFlow and PyTriton from PyPI; its suites use loopback only).
then_command() {
  in_root bash -c "cd /src && $1"
}
export -f in_root
export root logs

say "commit $commit, work dir $work, prerequisites: ${PREREQS[*]}"
step base-root base_root
step network network
step mounts mounts
step prereqs prerequisites
step clone clone
step setup setup
step serve serve
sed -n 's/^check: /  /p' "$logs/serve.log"
for c in "${then_cmds[@]}"; do
  name=$(basename "${c%% *}" .sh)
  step "$name" then_command "$c"
  # The last lines of what it printed (test-all.sh ends with its summary of suites).
  tail -n 8 "$logs/$name.log" | sed 's/^/  /'
done
