#!/usr/bin/env bash
# The CUDA path, end to end, on a machine with an NVIDIA GPU: device facts, the gpu-marked tests, one
# round of every method on its tiny config on CUDA, the P9 (LoRA MFU) and P16 (Ray actors on the GPU)
# benchmarks. Everything lands in bench/results/gpu-check/ (summary.md, one log per step, the JSON).
#
#   bash scripts/gpu_check.sh            # run it (refuses without nvidia-smi or a CUDA torch)
#   bash scripts/gpu_check.sh --dry-run  # list the steps, one a line; runs nothing, any machine
#   PY=python3 bash scripts/gpu_check.sh # another interpreter (one whose torch is a CUDA build)
#   GPU_CHECK_BUDGET_S=480 bash scripts/gpu_check.sh   # a budget other than 10 minutes
#
# A 10-minute budget in all: each step runs under `timeout` with what is left of it (at most its own
# cap), so one hung step cannot eat the others' time; a step that fails or times out is recorded in
# summary.md and the next one runs. The exit status is 1 when any step failed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PY:-.venv/bin/python}"
OUT=bench/results/gpu-check
BUDGET_S="${GPU_CHECK_BUDGET_S:-600}"
if ! [[ "$BUDGET_S" =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu_check: GPU_CHECK_BUDGET_S must be a whole number of seconds above 0, got '$BUDGET_S'" >&2
  exit 2
fi

# name|cap in seconds|command
STEPS=("device-info|30|nvidia-smi --query-gpu=name,memory.total --format=csv && $PY -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.get_device_name(0))'")
STEPS+=("pytest-gpu|240|$PY -m pytest -q -p no:xdist -m gpu tests/gpu -rs")
# Every method's tiny config (tests/integration/test_contract.py requires one per registered method).
for config in configs/test/*-tiny.yaml; do
  m=$(basename "$config" -tiny.yaml)
  STEPS+=("run-$m|60|$PY -m fedtune run $config model.device=cuda fed.rounds=1 -o $OUT/runs/$m")
done
STEPS+=("bench-p9|120|$PY -m bench p9 --results-dir $OUT")
STEPS+=("bench-p16|120|$PY -m bench p16 --rounds 3 --repeats 1 --set ray.num_gpus=0.5 --set model.device=auto --results-dir $OUT")

if [ "${1:-}" = "--dry-run" ]; then
  for step in "${STEPS[@]}"; do
    IFS='|' read -r name cap command <<<"$step"
    echo "$name (<= ${cap}s): $command"
  done
  exit 0
fi
if [ $# -gt 0 ]; then
  echo "usage: bash scripts/gpu_check.sh [--dry-run]" >&2
  exit 2
fi

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi missing or failing); nothing run." >&2
  echo "Run it on a machine with a CUDA GPU, or list the steps with --dry-run." >&2
  exit 1
fi
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "gpu_check: $PY not found: run bash scripts/setup.sh first (with a CUDA build of torch)," >&2
  echo "or name an interpreter that has one: PY=python3 bash scripts/gpu_check.sh" >&2
  exit 1
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: torch in $PY sees no CUDA device (a CPU-only wheel? scripts/setup.sh installs one);" >&2
  echo "install a CUDA build of torch into .venv, then rerun." >&2
  exit 1
fi

export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" PYTHONPATH="src:.${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT/logs"
start=$(date +%s)
failed=0
{
  echo "# GPU check"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo "| step | status | seconds | log |"
  echo "|---|---|---|---|"
} >"$OUT/summary.md"
for step in "${STEPS[@]}"; do
  IFS='|' read -r name cap command <<<"$step"
  left=$((BUDGET_S - ($(date +%s) - start)))
  log="$OUT/logs/$name.log"
  if [ "$left" -le 0 ]; then
    echo "| $name | skipped (budget spent) | 0 | |" >>"$OUT/summary.md"
    failed=1
    continue
  fi
  limit=$((cap < left ? cap : left))
  echo "== $name (<= ${limit}s)"
  began=$(date +%s)
  if timeout "$limit" bash -c "$command" >"$log" 2>&1; then
    status=ok
  else
    code=$?
    status="failed (exit $code)"
    [ "$code" -eq 124 ] && status="timed out after ${limit}s"
    failed=1
  fi
  echo "| $name | $status | $(($(date +%s) - began)) | logs/$name.log |" >>"$OUT/summary.md"
  echo "   $status"
done
for result in "$OUT"/p9.md "$OUT"/p16.md; do
  if [ -f "$result" ]; then
    { echo; cat "$result"; } >>"$OUT/summary.md"
  fi
done
echo "wrote $OUT/summary.md"
exit "$failed"
