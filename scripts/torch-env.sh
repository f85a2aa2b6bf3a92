# Source this: points tch's build at the venv's libtorch (the binary keeps the path as its rpath).
_mesh_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIBTORCH="$(ls -d "$_mesh_root"/.venv/lib/python3*/site-packages/torch 2>/dev/null | head -n1)"
if [ -z "$LIBTORCH" ] || [ ! -d "$LIBTORCH/lib" ]; then
  echo "no PyTorch in $_mesh_root/.venv; run scripts/setup-torch.sh" >&2
  return 1 2>/dev/null || exit 1
fi
export LIBTORCH
unset _mesh_root
