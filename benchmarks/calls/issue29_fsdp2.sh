#!/bin/bash
# issue 29, call B (one GPU, about 8 minutes): speculators' FSDP2 path with one rank
# (`torchrun --nproc_per_node 1 ... train`, bf16 parameters) at 8,192 tokens beside this call's
# single-process tf32 baseline (its losses: issue29_bf16_loss.sh). Timeouts leave room for a
# fresh machine's compilation (issue29_bf16.sh says how long).
# Carry .whl (the 9 wheels); run from the repo root.
source benchmarks/calls/_common.sh
# SINGLE=path/gpu_train.json (carried): the baseline an earlier call measured on this machine,
# still warm; without it this call measures its own first.
if [ -n "$SINGLE" ]; then S=$SINGLE; else
  step tf32 170 python benchmarks/gpu_train.py --kimi --total-seq-lens 8192 --steps 8 --warmup 3 --precision tf32
  S=$OUT/tf32/gpu_train.json
fi
M="python benchmarks/gpu_train_multi.py --ranks 1"
step fsdp 300 $M --total-seq-len 8192 --steps 8 --warmup 3 --single $S
