#!/usr/bin/env bash
# Set up, then run the embedded demo: FedIT on SmolLM2-135M-Instruct (offline zoo), 4 clients,
# pathological non-IID split of the built-in instruction set. Extra arguments are config overrides.
# Each invocation writes a new run directory, so the command can be repeated as is.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
out="runs/fedit-smollm2-$(date +%Y%m%d-%H%M%S)"
.venv/bin/fedtune run configs/demo/fedit-smollm2.yaml --output-dir "$out" "$@"
.venv/bin/fedtune report "$out"
