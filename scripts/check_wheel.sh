#!/usr/bin/env bash
# The package as a user installs it from an index: build the sdist and the wheel from it, install the wheel with the [eval]
# extra into a fresh environment (not editable), and run the commands from an empty folder outside the checkout, so
# that nothing but the installed package is read:
#   hf-rope-ext list
#   hf-rope-ext extend --rope-type yarn --factor 2 --out DIR   (the bundled model; DIR gets config.json and the card)
#   python -m hf_rope_ext.lm_eval --help
# torch is installed first as scripts/setup.sh does (HF_ROPE_EXT_TORCH, default torch==2.13.0). Everything is made
# in a temporary folder, removed at the end (KEEP_WHEEL_CHECK=1 keeps it). PYTHON: the interpreter to build with and
# to make the environments from (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
CHECKOUT=$PWD
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${HF_ROPE_EXT_TORCH:-torch==2.13.0}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hf-rope-ext-wheel.XXXXXX")
[ "${KEEP_WHEEL_CHECK:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT
step() { echo "== wheel check: $*"; }

step "build the sdist, and the wheel from it, into $WORK/dist"
"$PYTHON" -m venv "$WORK/build-env"
"$WORK/build-env/bin/python" -m pip install -q build
"$WORK/build-env/bin/python" -m build --outdir "$WORK/dist" "$CHECKOUT" >"$WORK/build.log" 2>&1 ||
  { tail -40 "$WORK/build.log"; exit 1; }
WHEEL=$(ls "$WORK"/dist/*.whl)
SDIST=$(ls "$WORK"/dist/*.tar.gz)
"$WORK/build-env/bin/python" -m zipfile -l "$WHEEL" >"$WORK/wheel.txt"
tar -tzf "$SDIST" >"$WORK/sdist.txt"
for member in hf_rope_ext/publish/model_cards/extended.md hf_rope_ext/store/bundled/tiny-llama-stdlib/model.safetensors; do
  grep -q "$member" "$WORK/wheel.txt" || { echo "the wheel lacks $member"; exit 1; }
  grep -q "$member" "$WORK/sdist.txt" || { echo "the sdist lacks $member"; exit 1; }
done

step "install $(basename "$WHEEL")[eval] into a fresh environment"
"$PYTHON" -m venv "$WORK/env"
PIP="$WORK/env/bin/python -m pip --disable-pip-version-check -q"
[ "$TORCH_SPEC" = skip ] || $PIP install "$TORCH_SPEC"
$PIP install "$WHEEL[eval]"

step "run the commands from $WORK/run (no checkout on the path)"
mkdir "$WORK/run"
cd "$WORK/run"
unset PYTHONPATH
export PATH="$WORK/env/bin:$PATH" OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
where=$(python -c "import hf_rope_ext, os; print(os.path.dirname(hf_rope_ext.__file__))")
case "$where" in
  "$WORK/env/"*) ;;
  *) echo "hf_rope_ext imported from $where, not from the fresh environment"; exit 1 ;;
esac
hf-rope-ext list >list.md
grep -q '`yarn`' list.md && grep -q '`self_extend`' list.md || { cat list.md; exit 1; }
hf-rope-ext extend --rope-type yarn --factor 2 --out extended --no-progress >extend.log 2>&1 || { tail -40 extend.log; exit 1; }
for file in config.json README.md report.json; do
  [ -s "extended/$file" ] || { echo "extend --out wrote no $file"; tail -40 extend.log; exit 1; }
done
python -c "import json; p = json.load(open('extended/config.json'))['rope_parameters']; assert p['rope_type'] == 'yarn' and p['factor'] == 2.0, p"
grep -q "hf-rope-ext" extended/README.md || { echo "extended/README.md is not the package's card"; exit 1; }
python -m hf_rope_ext.lm_eval --help >lm_eval_help.txt
grep -qi "usage" lm_eval_help.txt || { cat lm_eval_help.txt; exit 1; }
step "passed: $(basename "$WHEEL") and $(basename "$SDIST")"
