#!/bin/bash
# issue 29, call A (one GPU, about 9.5 minutes): at 8,192 tokens bf16 and this call's tf32
# baseline, then bf16's symptom without the shim. bf16's losses: issue29_bf16_loss.sh.
# A fresh machine compiles for minutes (2026-12-07, H100): the first step 100-130 s, then the
# epoch's end (validation compiles its own graph, a 14 GB checkpoint) 45-90 s more; on the same
# machine warm, 44 s and 28 s. Each timeout leaves room for a fresh machine; a run cut short
# still returns its train_metrics.jsonl (step times, losses). The runs go in the order they matter.
# Carry .whl (the 9 wheels); run from the repo root.
source benchmarks/calls/_common.sh
K="python benchmarks/gpu_train.py --kimi"
step bf16 290 $K --total-seq-lens 8192 --steps 8 --warmup 3 --precision bf16
step tf32 170 $K --total-seq-lens 8192 --steps 8 --warmup 3 --precision tf32
SPECULATORS_COMPAT_DISABLE=draft_attention_autocast_dtype step noshim 100 $K --total-seq-lens 2048 --steps 2 --warmup 1 --precision bf16
