#!/usr/bin/env bash
# The GPU check: the causal-LM task at GPT-2 small's shape, trained by the project's loop under torchrun on every GPU
# of this machine in bf16 (fp16 on GPUs without it); tokens/s and MFU against the GPU's dense peak (looked up by its
# exact name) of DDP, FSDP2 and DeepSpeed ZeRO-2, each without and with --compile, and where a DDP step's time goes
# (with one GPU they communicate nothing: the differences are their own overhead and the compiler's); then the
# fine-tuning task on a model of Llama 3.2 1B's shape (random weights), with LoRA and in full, under FSDP2 (one GPU:
# the model as it is), tokens/s and MFU (past the default TIME_LIMIT after the others: run them with --only). Results in
# $OUT/result.json. Installs nothing: its Python (PYTHON, else .venv/bin/python or python3, whichever sees a GPU) needs
# torch with CUDA, numpy, pyarrow and pyyaml (deepspeed for the ZeRO-2 comparison, transformers and peft for the
# fine-tuning); no Spark.
#
#   bash benchmarks/gpu_check.sh             # runs; without a visible GPU, a dry run
#   bash benchmarks/gpu_check.sh --dry-run   # prints the plan (commands, model, FLOP formula, peak), writes nothing
#   bash benchmarks/gpu_check.sh --dry-run --device-name "NVIDIA H200" --gpus 1   # the plan for another machine
#   bash benchmarks/gpu_check.sh --only ddp ddp-compiled                         # some of the runs
#   bash benchmarks/gpu_check.sh --only llama-1b-lora llama-1b-full              # the 1B fine-tuning rows (~4 min)
#
# Settings: OUT (build/gpu-check), BATCH_SIZE (32 sequences a GPU), STEPS (30 an epoch), EPOCHS (2, the first is
# warm-up), PEAK_TFLOPS (a GPU's dense peak where the lookup has none), TIME_LIMIT (450 s for everything).
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
esac

# The interpreter: PYTHON if set, else the first of .venv/bin/python and python3 whose torch sees a GPU (a carried
# .venv may hold a CPU build of torch), else the first that has torch (a dry run).
if [ -n "${PYTHON:-}" ]; then candidates=("$PYTHON"); else candidates=(.venv/bin/python python3); fi
python=
for candidate in "${candidates[@]}"; do
  if "$candidate" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" >/dev/null 2>&1; then
    python=$candidate; break
  fi
done
if [ -z "$python" ]; then
  for candidate in "${candidates[@]}"; do
    if "$candidate" -c "import torch" >/dev/null 2>&1; then python=$candidate; break; fi
  done
fi
if [ -z "$python" ]; then
  echo "error: none of ${candidates[*]} imports torch; this check installs nothing (set PYTHON)" >&2
  exit 1
fi
missing=$("$python" -c "
import importlib.util
print(' '.join(name for name in ('numpy', 'pyarrow', 'yaml') if importlib.util.find_spec(name) is None))")
if [ -n "$missing" ]; then
  echo "error: $python lacks $missing; this check installs nothing (set PYTHON to an interpreter that has them)" >&2
  exit 1
fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"

time_limit=${TIME_LIMIT:-450}
options=(--out "${OUT:-build/gpu-check}" --batch-size "${BATCH_SIZE:-32}" --steps "${STEPS:-30}"
         --epochs "${EPOCHS:-2}" --time-limit "$time_limit")
if [ -n "${PEAK_TFLOPS:-}" ]; then options+=(--peak-tflops "$PEAK_TFLOPS"); fi

if command -v nvidia-smi >/dev/null 2>&1; then
  echo "+ nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
fi
echo "+ $python -m benchmarks.gpu_check ${options[*]} $*"
# The check keeps to its own time limit; this one is the backstop should a process hang past it.
exec timeout --kill-after=15 "$((${time_limit%.*} + 30))" "$python" -m benchmarks.gpu_check "${options[@]}" "$@"
