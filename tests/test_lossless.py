"""serve-check's lossless verdict: where outputs with and without the draft part, the verifier's
own margin there (its logprobs) tells a numerical tie from a violation.

The verdict's inputs are what the serving child returns (tests/test_serving.py runs it in real
vLLM, with a violation injected into vLLM's rejection sampler); here its rules, on such results.
"""

from __future__ import annotations

import pytest

from speculators_compat.oracle.reference import tolerance
from speculators_compat.pipeline.serve import Divergence, divergences, tie_tolerance


def _base(outputs, margins, spreads, dtype="float32"):
    return {"outputs": outputs, "margins": margins, "spreads": spreads, "dtype": dtype}


def test_identical_outputs_part_nowhere():
    base = _base([[1, 2, 3]], [[5.0, 5.0, 5.0]], [[20.0] * 3])
    assert divergences(base, {"outputs": [[1, 2, 3]]}) == []


def test_the_first_differing_token_is_judged_by_the_verifier_margin_there():
    base = _base(
        [[1, 2, 3, 4], [7, 8, 9]], [[9.0, 1e-4, 9.0, 9.0], [9.0, 2.0, 9.0]], [[20.0] * 4, [20.0] * 3]
    )
    spec = {"outputs": [[1, 5, 6, 4], [7, 8, 1]]}
    tie, violation = divergences(base, spec)
    assert (tie.prompt, tie.position, tie.margin) == (0, 1, 1e-4)
    assert tie.tie and "numerical tie" in tie.line()
    assert (violation.prompt, violation.position, violation.margin) == (1, 2, 9.0)
    assert not violation.tie and "VIOLATION" in violation.line() and "prompt 1, token 2" in violation.line()


def test_an_output_that_stops_early_is_a_violation():
    base = _base([[1, 2]], [[9.0, 9.0]], [[20.0, 20.0]])
    (cut,) = divergences(base, {"outputs": [[1, 2, 3]]})
    assert cut.position == 2 and cut.margin is None and not cut.tie
    assert "past the end" in cut.line()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_tolerance_is_the_dtype_state_bound_on_both_logits_at_the_logits_scale(dtype):
    assert tie_tolerance(dtype, 10.0) == pytest.approx(2 * tolerance(dtype, sharp=True) * 10.0)
    assert tie_tolerance(dtype, 20.0) == pytest.approx(2 * tie_tolerance(dtype, 10.0))
    # a bfloat16 verifier's ties are wider than a float32 one's: 500 times where vLLM's float32
    # kernels are exact (SHARP_TOLERANCE), 10 times with IPEX's (0.11: TOLERANCE["float32"])
    assert tie_tolerance("bfloat16", 10.0) >= 10 * tie_tolerance("float32", 10.0)


def test_a_divergence_round_trips_through_the_report():
    d = Divergence(prompt=3, position=4, margin=0.5, tolerance=0.1)
    import dataclasses

    assert Divergence(**dataclasses.asdict(d)) == d and not d.tie
