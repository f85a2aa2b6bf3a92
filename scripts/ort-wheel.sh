#!/usr/bin/env bash
# Which ONNX Runtime wheel set-up installs into .venv, printed as a pip requirement (why on stderr):
# PyPI's onnxruntime-gpu, with the CUDA 13 and cuDNN 9 libraries its `cuda` and `cudnn` extras pull,
# on a host whose NVIDIA driver runs CUDA 13 (driver 580 or newer, as nvidia-smi reports it);
# otherwise the CPU wheel. MESH_ONNXRUNTIME=cpu or gpu chooses instead (auto is the default).
set -euo pipefail
VERSION=1.31.1
CPU="onnxruntime==$VERSION"
GPU="onnxruntime-gpu[cuda,cudnn]==$VERSION"
case "${MESH_ONNXRUNTIME:-auto}" in
  cpu) echo "$CPU"; exit 0 ;;
  gpu) echo "$GPU"; exit 0 ;;
  auto) ;;
  *) echo "ort-wheel: MESH_ONNXRUNTIME must be cpu, gpu or auto, not '$MESH_ONNXRUNTIME'" >&2; exit 2 ;;
esac
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 | tr -d '[:space:]' || true)
if [ -z "$driver" ]; then
  echo "$CPU"
  exit 0
fi
major=${driver%%.*}
if ! [[ "$major" =~ ^[0-9]+$ ]]; then
  echo "ort-wheel: cannot read the NVIDIA driver's version (nvidia-smi said '$driver'); ONNX models will run on the CPU (MESH_ONNXRUNTIME=gpu forces the GPU wheel)" >&2
  echo "$CPU"
elif [ "$major" -ge 580 ]; then
  echo "ort-wheel: NVIDIA driver $driver: installing onnxruntime-gpu with CUDA 13 and cuDNN 9 from PyPI" >&2
  echo "$GPU"
else
  echo "ort-wheel: NVIDIA driver $driver is older than CUDA 13 needs (580); ONNX models will run on the CPU (MESH_ONNXRUNTIME=gpu forces the GPU wheel)" >&2
  echo "$CPU"
fi
