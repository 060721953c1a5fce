#!/usr/bin/env bash
# The GPU check: the core training loop under torchrun on one GPU, a transformer-sized model in bf16, its
# throughput and model FLOPs utilisation (MFU) against the GPU's peak; DeepSpeed ZeRO-2 against DDP when deepspeed
# is importable. Installs nothing: it uses the Python it finds (PYTHON, else .venv/bin/python, else python3),
# which needs torch with CUDA, numpy and pyarrow (no pyspark: the data is staged without Spark).
#
#   bash benchmarks/gpu_check.sh             # runs, or falls back to a dry run when no GPU is visible
#   bash benchmarks/gpu_check.sh --dry-run   # prints what it would do, runs nothing on a GPU
#
# Sizes: HIDDEN_SIZES (default 8 layers of 8192, ~470 M weights), BATCH_SIZE (8192), STEPS (steps per epoch, 30),
# EPOCHS (3: the first is warm-up), PEAK_TFLOPS (default from the GPU's name), OUT (default build/gpu-check).
set -euo pipefail
cd "$(dirname "$0")/.."

dry_run=no
for argument in "$@"; do
  case "$argument" in
    --dry-run) dry_run=yes ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown option: $argument (use --dry-run or --help)" >&2; exit 2 ;;
  esac
done

python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
hidden_sizes=${HIDDEN_SIZES:-8192,8192,8192,8192,8192,8192,8192,8192}
batch_size=${BATCH_SIZE:-8192}
steps=${STEPS:-30}
epochs=${EPOCHS:-3}
out=${OUT:-build/gpu-check}
rows=$((batch_size * steps))
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ "$dry_run" = no ] && ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "no GPU visible to $python (torch.cuda.is_available() is false): dry run"
  dry_run=yes
fi
missing=$("$python" -c "
import importlib.util
print(' '.join(name for name in ('torch', 'numpy', 'pyarrow') if importlib.util.find_spec(name) is None))" 2>/dev/null || echo python)
if [ -n "$missing" ]; then
  echo "error: $python lacks $missing; this check installs nothing (set PYTHON to an interpreter that has them)" >&2
  exit 1
fi

step() {  # print the command; run it unless this is a dry run
  echo "+ $*"
  if [ "$dry_run" = no ]; then "$@"; fi
}

peak_option=()
if [ -n "${PEAK_TFLOPS:-}" ]; then peak_option=(--peak-tflops "$PEAK_TFLOPS"); fi

echo "== plan =="
"$python" -m benchmarks.gpu_check plan --hidden-sizes "$hidden_sizes" --batch-size "$batch_size"
if [ "$dry_run" = yes ]; then
  echo "dry run: the commands below are printed, not run"
else
  rm -rf "$out" && mkdir -p "$out"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi

echo "== stage $rows synthetic rows (no Spark) =="
step "$python" -m benchmarks.gpu_check stage --dir "$out/staging" --rows "$rows" --files 1

echo "== DDP: torchrun, 1 GPU, bf16 =="
step "$python" -m torch.distributed.run --standalone --nproc-per-node 1 \
  -m distributed_training.training.train_staged --staging-dir "$out/staging" --output-dir "$out/ddp" \
  --no-resume --gpu --bf16 --hidden-sizes "$hidden_sizes" --batch-size "$batch_size" --epochs "$epochs"
step "$python" -m benchmarks.gpu_check report --metrics "$out/ddp/metrics.json" --hidden-sizes "$hidden_sizes" \
  --label "DDP bf16" --output "$out/ddp.json" "${peak_option[@]}"

echo "== DeepSpeed ZeRO-2 =="
if ! "$python" -c "import deepspeed" >/dev/null 2>&1; then
  echo "skipped: deepspeed is not importable by $python (carry it, or install it there, to compare ZeRO-2 with DDP)"
else
  step "$python" -m torch.distributed.run --standalone --nproc-per-node 1 \
    -m benchmarks.gpu_check zero2 --staging-dir "$out/staging" --output-dir "$out/zero2" \
    --hidden-sizes "$hidden_sizes" --batch-size "$batch_size" --epochs "$epochs"
  step "$python" -m benchmarks.gpu_check report --metrics "$out/zero2/metrics.json" --hidden-sizes "$hidden_sizes" \
    --label "DeepSpeed ZeRO-2 bf16" --output "$out/zero2.json" "${peak_option[@]}"
fi
if [ "$dry_run" = no ]; then echo "figures in $out/*.json"; fi
