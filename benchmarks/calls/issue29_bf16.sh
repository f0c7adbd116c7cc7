#!/bin/bash
# issue 29, call A (one GPU, about 9.5 minutes): at 8,192 tokens bf16 and this call's tf32
# baseline; bf16's losses at 2,048 tokens x ~104 steps (fp32/tf32 of the same data:
# gpu_train-precision-h100-2026-12-07.json); bf16's symptom without the shim.
# On a fresh machine a run's first step compiles the draft for 50-130 s (Inductor's cache in
# /tmp then serves the runs after it in the same call): each timeout leaves room for that, and
# the runs go in the order they matter (2026-12-07: timeouts of 50-150 s killed all five runs).
# Carry .whl (the 9 wheels); run from the repo root.
source benchmarks/calls/_common.sh
K="python benchmarks/gpu_train.py --kimi"
step bf16 200 $K --total-seq-lens 8192 --steps 8 --warmup 3 --precision bf16
step lossbf16 150 $K --total-seq-lens 2048 --steps 135 --warmup 5 --precision bf16
step tf32 120 $K --total-seq-lens 8192 --steps 8 --warmup 3 --precision tf32
SPECULATORS_COMPAT_DISABLE=draft_attention_autocast_dtype step noshim 90 $K --total-seq-lens 2048 --steps 2 --warmup 1 --precision bf16
