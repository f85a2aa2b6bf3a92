# Sourced by scripts/check-fresh.sh and scripts/build-image.sh: taking down a root they chrooted into.
#
# release_root ROOT: stops every process whose root is ROOT (SIGTERM, then SIGKILL after 2 s), then
# unmounts everything under ROOT, innermost first; prints the stopped pids on stderr and, on
# stdout, how many mounts are still under ROOT. Delete ROOT only when that is 0: a bind mount left
# under it would let rm reach the host.
release_root() {
  local root=$1 pids="" p
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && pids="$pids ${p#/proc/}"
  done
  if [ -n "$pids" ]; then
    kill -TERM $pids 2>/dev/null; sleep 2; kill -KILL $pids 2>/dev/null
    echo "stopped processes left in $root:$pids" >&2
  fi
  awk -v r="$root" 'index($2, r) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r p; do
    umount -l "$p" 2>/dev/null || echo "could not unmount $p" >&2
  done
  awk -v r="$root" 'index($2, r) == 1' /proc/self/mounts | wc -l
}
