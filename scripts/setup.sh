#!/usr/bin/env bash
# Create .venv and install fedtune with its dev tools. torch==2.13.0 comes first: that pin
# resolves to a CPU wheel, and anything installed before it could pull a CUDA build instead.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev]"
