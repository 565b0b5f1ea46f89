#!/usr/bin/env bash
# Create .venv and install hf-rope-ext with its test tools. Safe to run again (it only adds what is missing).
#
# torch: a pinned torch==2.13.0 is installed first. On a CPU-only machine whose pip is set up with a local CPU build
# (as on this project's machines) that is the CPU build; on a GPU machine PyPI's 2.13.0 wheel brings CUDA.
# Set HF_ROPE_EXT_TORCH="torch==X" to choose another build, or HF_ROPE_EXT_TORCH=skip to keep an installed one.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/python -m pip --disable-pip-version-check -q"
TORCH_SPEC=${HF_ROPE_EXT_TORCH:-torch==2.13.0}
if [ "$TORCH_SPEC" != skip ] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
  $PIP install "$TORCH_SPEC"
fi
$PIP install -e ".[test]"
.venv/bin/python -c "import torch, transformers, hf_rope_ext; print('hf-rope-ext', hf_rope_ext.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
