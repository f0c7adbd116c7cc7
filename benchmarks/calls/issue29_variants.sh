#!/bin/bash
# issue 29, call C (one GPU, about 9.5 minutes): at 8,192 tokens, train's fused AdamW (bf16)
# beside the foreach kernels, and padding batches to a multiple of 1,024 tokens beside tf32,
# each with its baseline in this call.
# Carry .whl (the 9 wheels); run from the repo root.
source benchmarks/calls/_common.sh
K="python benchmarks/gpu_train.py --kimi --total-seq-lens 8192 --steps 8 --warmup 3"
step bf16 180 $K --precision bf16
step bf16foreach 110 $K --precision bf16 --foreach-adamw
step tf32 150 $K --precision tf32
step tf32pad 130 $K --precision tf32 --pad-multiple 1024
