#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one go (under 9 minutes on one H100/H200):
# the `gpu` tests, the attention benchmark in bf16 up to T = 8192, the sampling (KV cache)
# benchmark, tokens/s and model FLOPs utilisation of experiment=small_gpu's model, and a short
# experiment=small_gpu run.
# Output: gpu_check/{pytest.log,attention.txt,sampling.txt,mfu.txt,train.log} and
# benchmarks/results/{attention,sampling,mfu}-cuda.json
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_check}
mkdir -p "$out"
export WANDB_MODE=offline WANDB_SILENT=true PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
timeout 150 python -m pytest -m gpu -q 2>&1 | tee "$out/pytest.log"
timeout 200 python benchmarks/attention.py --dtype bfloat16 --seq-lens 64 256 1024 4096 8192 --batch 8 \
    --n-embd 384 --n-head 6 2>&1 | tee "$out/attention.txt"
timeout 90 python benchmarks/sampling.py --device cuda 2>&1 | tee "$out/sampling.txt"
timeout 60 python benchmarks/mfu.py --model small --batch 64 2>&1 | tee "$out/mfu.txt"
timeout 150 python train.py experiment=small_gpu trainer.max_steps=600 trainer.val_check_interval=300 \
    run_name=gpu-check 2>&1 | tail -n 30 | tee "$out/train.log"
