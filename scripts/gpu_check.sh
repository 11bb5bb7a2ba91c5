#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one go: the timeouts below sum to 390 s (the machine is
# lent for about 15 minutes in all, start-up included). Rerunnable on the same machine (every
# train.py run gets a fresh run name); exits non-zero when any part fails, after running the rest.
#   - the `gpu` tests;
#   - the attention benchmark in bf16 up to T = 8192 (benchmarks/results/attention-cuda.json);
#   - the sampling (KV cache) benchmark (sampling-cuda.json);
#   - tokens/s and model FLOPs utilisation of experiment=small_gpu's model (mfu-cuda.json);
#   - a short experiment=small_gpu data=tang+song run (run-small-gpu-tang-song-cuda.json: tokens/s,
#     Tang val/bpc and Song val/bpc after 300 steps).
# Logs: gpu_check/*.txt. Then: python -m benchmarks.report (the results page's GPU section).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_check}
mkdir -p "$out"
export WANDB_MODE=offline WANDB_SILENT=true PYTHONUNBUFFERED=1
failed=()
check() {  # check NAME SECONDS COMMAND...: run it under a timeout, log it, remember a failure
    local name=$1 seconds=$2
    shift 2
    echo "== $name (at most ${seconds} s)"
    timeout "$seconds" "$@" 2>&1 | tee "$out/$name.txt"
    local status=${PIPESTATUS[0]}
    [ "$status" -eq 0 ] || failed+=("$name (exit $status)")
}
check gpu 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
check pytest 70 python -m pytest -m gpu -q
check attention 75 python benchmarks/attention.py --dtype bfloat16 --seq-lens 64 256 1024 4096 8192 --batch 8 \
    --n-embd 384 --n-head 6
check sampling 45 python benchmarks/sampling.py --device cuda
check mfu 40 python benchmarks/mfu.py --model small --batch 128
check train 150 python benchmarks/train_run.py small-gpu-tang-song experiment=small_gpu data=tang+song \
    trainer.max_steps=300 trainer.val_check_interval=300
if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_check: failed: ${failed[*]}" >&2
    exit 1
fi
echo "gpu_check: every part passed; outputs in $out/ and benchmarks/results/*-cuda.json"
