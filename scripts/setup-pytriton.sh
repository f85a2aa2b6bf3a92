#!/usr/bin/env bash
# A venv with PyTriton (nvidia-pytriton 0.7.0 from PyPI) for the PyTriton tests, and the mesh's
# `mesh_pytriton` module (python/) installed in it: `python -m mesh_pytriton script.py` runs a
# PyTriton script on mesh-node. Kept apart from .venv because PyTriton pins numpy below 2. Also
# Triton's perf_analyzer 2.51 (.venv-pytriton/bin/perf_analyzer), which runs on PyTriton's libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv-pytriton/bin/python ]; then
  "$PY" -m venv .venv-pytriton
fi
.venv-pytriton/bin/pip install -q --disable-pip-version-check "nvidia-pytriton==0.7.0" ./python
.venv-pytriton/bin/python -c 'import pytriton, mesh_pytriton; print("setup-pytriton: PyTriton", __import__("importlib.metadata").metadata.version("nvidia-pytriton"), "in .venv-pytriton")'

# Triton's perf_analyzer 2.51 (the binary inside the tritonclient 2.51 wheel; the last build that
# runs on glibc 2.36), for the C API tests (--service-kind=triton_c_api). The two libraries it needs
# beside the system's (libb64, libcudart) ship in PyTriton's wheel, installed just above.
PA=.venv-pytriton/perf_analyzer
if [ ! -x "$PA/bin/perf_analyzer" ]; then
  mkdir -p "$PA/bin" "$PA/lib" .venv-pytriton/dl
  .venv-pytriton/bin/pip download -q --disable-pip-version-check --no-deps "tritonclient==2.51.0" \
    --platform manylinux1_x86_64 --only-binary=:all: -d .venv-pytriton/dl
  .venv-pytriton/bin/python - "$PA/bin/perf_analyzer" .venv-pytriton/dl/tritonclient-2.51.0-*.whl <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[2]) as z, open(sys.argv[1], "wb") as out:
    out.write(z.read("tritonclient-2.51.0.data/data/bin/perf_analyzer"))
PY
  chmod 755 "$PA/bin/perf_analyzer"
fi
LIBS=$(.venv-pytriton/bin/python -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')/nvidia_pytriton.libs
ln -sfn "$(ls "$LIBS"/libb64-*.so.0d)" "$PA/lib/libb64.so.0d"
ln -sfn "$(ls "$LIBS"/libcudart-*.so.12*)" "$PA/lib/libcudart.so.12"
cat > .venv-pytriton/bin/perf_analyzer <<EOS
#!/bin/sh
# Triton's perf_analyzer 2.51, set up by scripts/setup-pytriton.sh.
export LD_LIBRARY_PATH=$PWD/$PA/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
exec $PWD/$PA/bin/perf_analyzer "\$@"
EOS
chmod 755 .venv-pytriton/bin/perf_analyzer
.venv-pytriton/bin/perf_analyzer --version >/dev/null
echo "setup-pytriton: perf_analyzer 2.51 in .venv-pytriton/bin"
