#!/usr/bin/env bash
# The GPU checks in one go, on a machine with a CUDA GPU (no hub access needed): the exact and fast sweeps of
# Qwen3-style 1.7B and 8B students built from their configs (random weights, BF16), timings per row, peak
# memory against fp8probe's estimate, vLLM's FP8 KV cache on the embedded student against the simulated KV rows, and
# the vllm-cuda engine profile against vLLM itself (benchmarks/engine_fidelity.py --engine vllm-cuda) when vLLM and
# the converted student are there. Results: OUT/gpu_check.json, OUT/engine_fidelity.json (default runs/gpu-check).
#   benchmarks/gpu_check.sh [OUT] [--sizes 1.7B 8B] [--num-prompts 16] [--max-new-tokens 128]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu-check}
shift || true
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
PYTHONPATH=. "$PY" benchmarks/gpu_check.py --out "$out" "$@"
# BF16 against FP8 (torch._scaled_mm) GEMMs at decode shapes of Qwen3-1.7B and -8B, beside the throughput model's
# per-layer prediction (`fp8probe plan`): OUT/gemm_roofline.json
PYTHONPATH=. "$PY" benchmarks/gemm_roofline.py --device cuda --gpu "${GPU_MODEL:-H200}" --json "$out/gemm_roofline.json"
# The vllm-cuda engine profile against vLLM on this GPU (recipes, all-FP8 dynamic and static, the FP8 KV cache with
# scale 1.0 and with calibrated scales): needs vLLM's CUDA build and llm-compressor in this Python, and the embedded
# student in fp8probe's cache. Results: OUT/engine_fidelity.json and the table on stdout.
if PYTHONPATH=. "$PY" -c "import vllm, llmcompressor, fp8probe.model.embedded as e; assert (e.cache_dir() / e.NAME / 'config.json').exists()" 2>/dev/null; then
  PYTHONPATH=. "$PY" benchmarks/engine_fidelity.py --engine vllm-cuda --json "$out/engine_fidelity.json"
else
  echo "gpu_check: engine profile vllm-cuda not checked (needs vllm and llmcompressor in $PY and the embedded student cached)"
fi
