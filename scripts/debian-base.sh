#!/usr/bin/env bash
# Prints the path of a minimal Debian 12 root as a tarball (debootstrap --variant=minbase), made once
# and cached outside the repository in $MESH_FRESH_CACHE (default /var/cache/mesh-fresh). Used by
# scripts/check-fresh.sh (the fresh root) and scripts/build-image.sh (the image's base, since no
# image registry is reachable). Installs Debian's debootstrap when missing; needs root.
set -euo pipefail
suite=bookworm
cache=${MESH_FRESH_CACHE:-/var/cache/mesh-fresh}
tar=$cache/$suite-minbase.tar
if [ ! -s "$tar" ]; then
  [ "$(id -u)" = 0 ] || { echo "debian-base: needs root (debootstrap)" >&2; exit 2; }
  mirror=${MESH_FRESH_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)}
  mirror=${mirror:-http://deb.debian.org/debian}
  if ! command -v debootstrap >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends debootstrap >&2 \
      || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends debootstrap >&2; }
  fi
  tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/mesh-debootstrap.XXXXXX")
  trap 'rm -rf --one-file-system "$tmp"' EXIT
  debootstrap --variant=minbase "$suite" "$tmp" "$mirror" >&2
  install -d -m 0755 "$cache"
  tar -C "$tmp" -cf "$tar.part" . && mv "$tar.part" "$tar"
fi
echo "$tar"
