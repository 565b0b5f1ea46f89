#!/usr/bin/env bash
# Every GPU measurement the project reports, in one command, on a CUDA machine:
#
#   bash benchmarks/gpu.sh [OUT]        # default OUT: runs/gpu-<time>; writes OUT/gpu.json and OUT/gpu.md
#
# 0. correctness first (benchmarks/check_engines.py): every attention-level type's fast engine on CUDA (compiled
#    flex_attention), through sdpa, flash_attention_2 and flex_attention masks, prefill, decode and backward, fp32
#    and bf16, against the reference engine in fp32: the max error per type and case. Past a bound the timings
#    still run, but the script ends with exit status 1 and a FAIL line;
# 1. attention (benchmarks/bench_attention.py): every attention-level type against plain RoPE's sdpa call (torch's
#    flash kernel on CUDA in bf16), bf16, 32 query / 8 kv heads, head_dim 128: prefill at 8k, 32k and 64k tokens,
#    decode per token after 8k, 32k and 64k cached tokens (DynamicCache and StaticCache), time ratios and peak memory
#    (torch.cuda.max_memory_allocated);
# 2. long-context LoRA fine-tuning (benchmarks/bench_finetune_gpu.py): tokens/s, MFU, peak memory at 8k and 32k,
#    and the longest sequence a step fits (1B and 7B shapes);
# 3. the real-model pass key at 32k (scripts/real_model_report.py, issue 24): see the HOOK line below.
# Then benchmarks/gpu_report.py gathers them into one JSON and one markdown table. Without a CUDA device it stops
# at once with a message and exit status 2, measuring nothing. PYTHON picks the interpreter (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-runs/gpu-$(date +%Y%m%d-%H%M%S)}
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "benchmarks/gpu.sh: no CUDA device here (torch.cuda.is_available() is False with $PY); nothing measured" >&2
  exit 2
fi
mkdir -p "$OUT"
"$PY" -c "import torch, transformers; print('gpu.sh:', torch.cuda.get_device_name(), '| torch', torch.__version__, \
'| transformers', transformers.__version__)" | tee "$OUT/device.txt"

checked=0
PYTHONPATH=. "$PY" benchmarks/check_engines.py --device cuda --json "$OUT/engines.json" | tee "$OUT/engines.txt" \
  || checked=$?

PYTHONPATH=. "$PY" benchmarks/bench_attention.py --device cuda --head-dims 128 --dtypes bfloat16 --repeats 3 \
  --lengths 8192 32768 65536 --decode 8192 32768 65536 --decode-static 8192 32768 65536 \
  --json "$OUT/attention.json" | tee "$OUT/attention.txt"

PYTHONPATH=. "$PY" benchmarks/bench_finetune_gpu.py --reach --json "$OUT/finetune.json" | tee "$OUT/finetune.txt"

# >>> HOOK real-model pass key at 32k (issue 24's scripts/real_model_report.py, which replaced real_model_passkey.py):
# it measures on the CPU (extend.evaluate_method loads models on loading.load_model's default device) and fetches
# SmolLM2 on first use (the GPU machine has no network: carry ~/.cache/hf_rope_ext); enable once it takes a device:
# PYTHONPATH=. "$PY" scripts/real_model_report.py --cells yarn:4 --out "$OUT/passkey" | tee "$OUT/passkey.txt"

"$PY" benchmarks/gpu_report.py "$OUT"
if [ "$checked" != 0 ]; then
  echo "benchmarks/gpu.sh: FAIL: the fast engine on CUDA is off the reference engine past its bound ($OUT/engines.txt)" >&2
  exit 1
fi
