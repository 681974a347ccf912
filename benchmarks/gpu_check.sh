#!/usr/bin/env bash
# The GPU path in one device call: learner and rollout benchmarks at two Qwen3 shapes, then the
# gpu-marked tests; RESULT lines into $OUT/results.txt, full output into $OUT/log.txt.
#
# The device machine has torch, transformers, pyarrow and prometheus-client but no package
# index: first, on a machine with PyPI, fetch the few wheels the code needs for its Python 3.12:
#   bash benchmarks/gpu_check.sh --fetch-wheels          # -> .wheels/gpu (git-ignored, ~5 MB)
# then run this script there with .wheels/gpu carried (device tool: carry=[".wheels/gpu"]).
#   bash benchmarks/gpu_check.sh --smoke                  # the same steps at the tiny shape (CPU, CI)
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=.wheels/gpu
NEEDED="pydantic pytest pytest-timeout"
if [ "${1:-}" = "--fetch-wheels" ]; then
  exec python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$WHEELS" $NEEDED
fi
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=PASSIVE TOKENIZERS_PARALLELISM=false
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ! $PYTHON -c "import pydantic, pytest, pytest_timeout" 2>/dev/null; then
  SITE=$(mktemp -d)
  $PYTHON -m pip install -q --no-index --find-links "$WHEELS" --target "$SITE" $NEEDED || exit 1
  export PYTHONPATH=$PYTHONPATH:$SITE
fi
$PYTHON -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')" | tee "$OUT/env.txt"

status=0
step() {  # one benchmark, capped so one hang cannot eat the device budget
  echo "+ $*" | tee -a "$OUT/log.txt"
  timeout "${STEP_TIMEOUT:-200}" "$PYTHON" "$@" >> "$OUT/log.txt" 2>&1 || { echo "FAILED ($?): $*" | tee -a "$OUT/results.txt"; status=1; }
  grep '^RESULT' "$OUT/log.txt" | tail -1 | tee -a "$OUT/results.txt"
}
if [ "${1:-}" = "--smoke" ]; then
  step benchmarks/gpu_learner.py --shape tiny --steps 1 --warmup 0 --seq-len 256 --batch-tokens 1024
  step benchmarks/gpu_learner.py --shape tiny --loss grpo --activation-checkpointing --steps 1 --warmup 0 --seq-len 256 --batch-tokens 1024
  step benchmarks/gpu_rollout.py --shape tiny --envs 2 --turns 2 --prompt-tokens 32 --obs-tokens 8 --response-tokens 4
else
  step benchmarks/gpu_learner.py --shape qwen3-0.6b --loss opd
  step benchmarks/gpu_learner.py --shape qwen3-1.7b --loss opd
  step benchmarks/gpu_learner.py --shape qwen3-1.7b --loss grpo --activation-checkpointing
  step benchmarks/gpu_rollout.py --shape qwen3-0.6b
  step benchmarks/gpu_rollout.py --shape qwen3-1.7b
fi
echo "+ pytest -m gpu" | tee -a "$OUT/log.txt"
# The device has no pytest-xdist: the repository's addopts (two workers) are replaced.
$PYTHON -m pytest -q -p no:cacheprovider -o addopts="-ra --strict-markers" -m gpu tests/unit/test_gpu.py >> "$OUT/log.txt" 2>&1 || status=1
tail -1 "$OUT/log.txt" | tee -a "$OUT/results.txt"
exit $status
