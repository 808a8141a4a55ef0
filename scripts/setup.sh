#!/usr/bin/env bash
# Create .venv and install fedtune with its dev tools. torch==2.13.0 comes first: that pin
# resolves to a CPU wheel, and anything installed before it could pull a CUDA build instead.
# pip runs quietly (a fresh install takes minutes), so each step says one line of what it does.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
SECONDS=0
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
else
  echo "setup: using the existing .venv"
fi
echo "setup: installing torch 2.13.0 (CPU wheel)"
.venv/bin/python -m pip install -q "torch==2.13.0"
echo "setup: installing fedtune with the dev extras (pip install -e '.[dev]')"
.venv/bin/python -m pip install -q -e ".[dev]"
echo "setup: done in ${SECONDS} s"
