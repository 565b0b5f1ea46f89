#!/usr/bin/env bash
# Create .venv and install hf-rope-ext with its test tools. Safe to run again (it only adds what is missing).
#
# torch: a pinned torch==2.13.0 is installed first. On a CPU-only machine whose pip is set up with a local CPU build
# (as on this project's machines) that is the CPU build; on a GPU machine PyPI's 2.13.0 wheel brings CUDA.
# Set HF_ROPE_EXT_TORCH="torch==X" to choose another build, or HF_ROPE_EXT_TORCH=skip to keep an installed one.
#
# transformers: the newest release pyproject.toml admits. HF_ROPE_EXT_TRANSFORMERS=oldest installs the oldest one
# it admits instead (its lower bound), and HF_ROPE_EXT_VENV names the environment (default .venv); CI builds
# `.venv-oldest` that way to run the suite on both ends of the range. The same goes for lm-eval (the [eval] extra, which
# the tests of `--ruler` need): newest admitted in .venv, its lower bound with HF_ROPE_EXT_TRANSFORMERS=oldest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${HF_ROPE_EXT_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
TORCH_SPEC=${HF_ROPE_EXT_TORCH:-torch==2.13.0}
if [ "$TORCH_SPEC" != skip ] && ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  $PIP install "$TORCH_SPEC"
fi
PIN=()
if [ "${HF_ROPE_EXT_TRANSFORMERS:-newest}" = oldest ]; then
  PIN=("$("$VENV/bin/python" scripts/transformers_range.py --oldest-pin)")
  PIN+=("$("$VENV/bin/python" scripts/transformers_range.py --oldest-pin --package lm-eval)")
fi
$PIP install -e ".[test,eval]" "${PIN[@]}"
"$VENV/bin/python" -c "import torch, transformers, hf_rope_ext; print('hf-rope-ext', hf_rope_ext.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
