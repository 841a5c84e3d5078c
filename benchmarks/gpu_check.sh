#!/usr/bin/env bash
# The GPU checks in one go, on a machine with a CUDA GPU (no hub access needed): the exact and fast sweeps of
# Qwen3-style 1.7B and 8B students built from their configs (random weights, BF16), timings per row, peak
# memory against fp8probe's estimate, and vLLM's FP8 KV cache on the embedded student against the simulated
# KV rows when vLLM and the converted student are there. Results: OUT/gpu_check.json (default runs/gpu-check).
#   benchmarks/gpu_check.sh [OUT] [--sizes 1.7B 8B] [--num-prompts 16] [--max-new-tokens 128]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu-check}
shift || true
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
PYTHONPATH=. "$PY" benchmarks/gpu_check.py --out "$out" "$@"
