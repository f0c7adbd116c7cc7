"""How full speculators 0.3.0's packer leaves a training batch: the share of ``--total-seq-len``
that holds tokens, the rest being padding that every step still computes (speculators pads each
batch to ``--total-seq-len``). Needs speculators only (no GPU, no vLLM): seconds on a CPU.

Sample lengths (seeded): the GPU benchmark's pool (benchmarks/gpu_train.py --kimi: uniform
1,024-4,096 tokens, 40 samples as at 8,192), the same distribution over 2,800 samples, and a
chat-like one (log-normal, median about 700 tokens, capped at 8,192, 7,000 samples).

    python benchmarks/batch_fill.py [--total-seq-lens 8192,16384]
"""

from __future__ import annotations

import argparse

import numpy as np


def fill(lengths: list[int], total: int) -> tuple[int, float]:
    """Batches of one epoch on one rank and the share of their tokens that are not padding."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=total, lengths=np.array(lengths), num_replicas=1, rank=0
    )
    batches = list(iter(sampler))
    used = sum(min(total, sum(lengths[i] for i in batch)) for batch in batches)
    return len(batches), used / (len(batches) * total)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--total-seq-lens", type=lambda s: [int(x) for x in s.split(",")], default=[8192, 16384])
    args = p.parse_args()
    rng = np.random.default_rng(0)
    pools = {
        "gpu_train.py's pool (uniform 1,024-4,096, 40 samples)": rng.integers(1024, 4097, 40).tolist(),
        "uniform 1,024-4,096, 2,800 samples": rng.integers(1024, 4097, 2800).tolist(),
        "log-normal, median ~700, 7,000 samples": np.minimum(8192, rng.lognormal(6.5, 0.8, 7000) + 16)
        .astype(int)
        .tolist(),
    }
    for name, lengths in pools.items():
        for total in args.total_seq_lens:
            batches, share = fill(lengths, total)
            print(f"{name} at {total:,}: {batches} batches, {share:.1%} tokens, {1 - share:.1%} padding")


if __name__ == "__main__":
    main()
