#!/usr/bin/env bash
# Set up, then run the embedded demo: FedIT on SmolLM2-135M-Instruct (offline zoo), 4 clients,
# pathological non-IID split of the built-in instruction set. Extra arguments are config overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
.venv/bin/fedtune run configs/demo/fedit-smollm2.yaml "$@"
.venv/bin/fedtune report runs/fedit-smollm2
