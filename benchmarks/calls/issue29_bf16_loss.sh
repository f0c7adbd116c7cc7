#!/bin/bash
# issue 29, call A2 (one GPU, about 9.5 minutes): bf16's losses and FSDP2's (`torchrun
# --nproc_per_node 1`, speculators' bf16 parameters) at 2,048 tokens x ~104 steps, the
# data and seed of the fp32/tf32 series in gpu_train-precision-h100-2026-12-07.json (the issue's
# bar: within 1% of fp32's after >= 100 steps). A fresh machine compiles this shape for 1-2
# minutes, and validation's graph at the epoch's end again (issue29_bf16.sh says more).
# Carry .whl (the 9 wheels); run from the repo root.
source benchmarks/calls/_common.sh
step lossbf16 300 python benchmarks/gpu_train.py --kimi --total-seq-lens 2048 --steps 135 --warmup 5 --precision bf16
step fsdploss 250 python benchmarks/gpu_train_multi.py --ranks 1 --total-seq-len 2048 --steps 135 --warmup 5
