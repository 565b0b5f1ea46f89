#!/usr/bin/env bash
# Every GPU measurement the project reports, in one command, on a CUDA machine:
#
#   bash benchmarks/gpu.sh [OUT]        # default OUT: runs/gpu-<time>; writes OUT/gpu.json and OUT/gpu.md
#
# 0. correctness first (benchmarks/check_engines.py): every attention-level type's fast engine on CUDA (torch's
#    fused attention op where it takes a piece, compiled flex_attention elsewhere; the kernels named), through sdpa,
#    flash_attention_2 and flex_attention masks, prefill, decode and backward, fp32 and bf16, against the reference
#    engine in fp32: the max error per type and case. Past a bound the timings still run, but the script ends with
#    exit status 1 and a FAIL line;
# 1. attention (benchmarks/bench_attention.py): every attention-level type against plain RoPE's sdpa call (each row
#    names the kernels that ran, plain's backend included), bf16, 32 query / 8 kv heads, head_dim 128: prefill at
#    8k, 32k and 64k tokens, decode per token after 8k, 32k and 64k cached tokens (DynamicCache and StaticCache),
#    time ratios and peak memory (torch.cuda.max_memory_allocated);
# 1b. compiled decode (benchmarks/bench_compiled_decode.py): each type's attention step on a StaticCache after 32k
#    tokens compiled with mode="reduce-overhead" (a CUDA graph), checked against the uncompiled step, against plain
#    RoPE graphed the same way; and a 1B-shaped Llama's generate(cache_implementation="static") tokens/s after a 32k
#    prompt for rerope and self_extend against plain, with how many of its tokens agree with the uncompiled
#    generate's; each row names the kernels that ran. A compiled step off its uncompiled one past the bound (the
#    part's exit status 3) also ends the script with exit status 1 and a FAIL line;
# 2. long-context LoRA fine-tuning (benchmarks/bench_finetune_gpu.py): tokens/s, MFU, peak memory at 8k and 32k,
#    and the longest sequence a step fits (1B and 7B shapes);
# 3. where a decode step's time goes (benchmarks/profile_decode.py): torch.profiler over one attention call after 32k
#    cached tokens for plain RoPE, ReRoPE, xPos and Dual Chunk Attention, into OUT/profile.txt;
# 4. the real-model pass key at 32k (experiments/real_model_report.py): see the HOOK line below.
# Then benchmarks/gpu_report.py gathers them into one JSON and one markdown table. Without a CUDA device it stops
# at once with a message and exit status 2, measuring nothing. PYTHON picks the interpreter (default .venv/bin/python).
# GPU_QUICK=1 fits the whole script into about 10 minutes: each part under a time limit (a part
# cut off keeps what it printed in OUT/*.txt, the compiled part its rows so far, and is named as not measured by the
# report), fewer repeats and types, and no fine-tuning unless GPU_PARTS names it (then on the 1B shape only, its
# reach searched up to 128k tokens in steps of 16k). GPU_PARTS names the parts run (default "engines attention
# compiled finetune profile", under GPU_QUICK=1 "engines attention compiled profile"; a part left out is named as not
# measured by the report).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
QUICK=${GPU_QUICK:-0}
DEFAULT_PARTS="engines attention compiled finetune profile"
[ "$QUICK" = 1 ] && DEFAULT_PARTS="engines attention compiled profile"
PARTS=" ${GPU_PARTS:-$DEFAULT_PARTS} "
for name in $PARTS; do
  case "$name" in engines | attention | compiled | finetune | profile) ;; *)
    echo "benchmarks/gpu.sh: GPU_PARTS has '$name'; allowed: engines, attention, compiled, finetune, profile" >&2
    exit 2 ;;
  esac
done
FINETUNE=(--reach)
ATTENTION=(--repeats 3 --lengths 8192 32768 65536 --decode 8192 32768 65536 --decode-static 8192 32768 65536)
COMPILED=(--cached 32768 --prompt 32768 --new-tokens 256)
if [ "$QUICK" = 1 ]; then
  FINETUNE=(--reach --shapes 1b --reach-max 131072 --reach-step 16384)
  ATTENTION=(--repeats 1 --lengths 8192 32768 65536 --decode 8192 32768 --decode-static 32768)
  COMPILED=(--cached 32768 --steps 10 --types rerope self_extend dual_chunk xpos --prompt 32768 --new-tokens 128)
fi
part() {  # part SECONDS(under GPU_QUICK=1) NAME COMMAND...: run it, its output teed into OUT/NAME.txt
  local seconds=$1 name=$2
  shift 2
  [[ "$PARTS" == *" $name "* ]] || return 0
  if [ "$QUICK" = 1 ]; then set -- timeout "$seconds" "$@"; fi
  local status=0
  "$@" 2>&1 | tee "$OUT/$name.txt" || status=$?
  [ "$status" = 124 ] && echo "benchmarks/gpu.sh: $name cut off after $seconds s (GPU_QUICK=1)" | tee -a "$OUT/$name.txt"
  return "$status"
}
OUT=${1:-runs/gpu-$(date +%Y%m%d-%H%M%S)}
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "benchmarks/gpu.sh: no CUDA device here (torch.cuda.is_available() is False with $PY); nothing measured" >&2
  exit 2
fi
mkdir -p "$OUT"
"$PY" -c "import torch, transformers; print('gpu.sh:', torch.cuda.get_device_name(), '| torch', torch.__version__, \
'| transformers', transformers.__version__)" | tee "$OUT/device.txt"

checked=0
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
part 240 engines "$PY" benchmarks/check_engines.py --device cuda --json "$OUT/engines.json" || checked=$?

part 150 attention "$PY" benchmarks/bench_attention.py --device cuda --head-dims 128 --dtypes bfloat16 "${ATTENTION[@]}" \
  --json "$OUT/attention.json" || [ "$QUICK" = 1 ]

compiled=0
part 170 compiled "$PY" benchmarks/bench_compiled_decode.py --device cuda "${COMPILED[@]}" --json "$OUT/compiled.json" \
  || compiled=$?

part 100 finetune "$PY" benchmarks/bench_finetune_gpu.py "${FINETUNE[@]}" --json "$OUT/finetune.json" || [ "$QUICK" = 1 ]

part 40 profile "$PY" benchmarks/profile_decode.py --device cuda --cached 32768 --types default rerope xpos dual_chunk \
  || [ "$QUICK" = 1 ]

# >>> HOOK real-model pass key at 32k (experiments/real_model_report.py):
# it measures on the CPU (extend.evaluate_method loads models on loading.load_model's default device) and fetches
# SmolLM2 on first use (the GPU machine has no network: carry ~/.cache/hf_rope_ext); enable once it takes a device:
# PYTHONPATH=. "$PY" experiments/real_model_report.py --cells yarn:4 --out "$OUT/passkey" | tee "$OUT/passkey.txt"

"$PY" benchmarks/gpu_report.py "$OUT"
if [ "$checked" = 124 ]; then
  echo "benchmarks/gpu.sh: the check against the reference engine was cut off; its lines so far: $OUT/engines.txt" >&2
  exit 1
elif [ "$checked" != 0 ]; then
  echo "benchmarks/gpu.sh: FAIL: the fast engine on CUDA is off the reference engine past its bound ($OUT/engines.txt)" >&2
  exit 1
elif [ "$compiled" = 3 ]; then
  echo "benchmarks/gpu.sh: FAIL: a compiled decode step is off its uncompiled step past the bound ($OUT/compiled.txt)" >&2
  exit 1
fi
