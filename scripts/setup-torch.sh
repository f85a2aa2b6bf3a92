#!/usr/bin/env bash
# Sets up the `torch` feature: everything scripts/setup.sh does, plus PyTorch 2.13 in the project
# venv, with target/release/mesh-node built to serve TorchScript models.
exec "$(dirname "$0")/setup.sh" --torch
