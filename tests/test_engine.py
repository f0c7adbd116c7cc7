"""Every fixture model loads in real vLLM on CPU, generates, and matches the transformers oracle."""

from __future__ import annotations

import pytest

from speculators_compat.oracle.reference import relative_error, tolerance
from speculators_compat.tiny import sample_token_ids, sharpened

pytestmark = pytest.mark.engine


def test_layer_outputs_match_the_transformers_oracle(engine):
    worst = 0.0
    for ids in sample_token_ids(engine.path, 4):
        got = engine.layer_outputs(ids)
        expected = engine.reference.layer_outputs(ids)
        assert got.shape == expected.shape
        worst = max(worst, *(relative_error(got[k], expected[k]) for k in range(len(got))))
    assert worst <= tolerance(engine.dtype, sharpened(engine.recipe)), f"worst relative error {worst:.3e}"


def test_the_comparison_tells_layers_and_sequences_apart(engine):
    """A state from the neighbouring layer or another sequence is far outside the tolerance."""
    a, b = sample_token_ids(engine.path, 2)
    n = min(len(a), len(b))
    got = engine.layer_outputs(a)
    other = engine.reference.layer_outputs(b)
    expected = engine.reference.layer_outputs(a)
    bound = 5 * tolerance(engine.dtype, sharpened(engine.recipe))
    for k in range(len(got) - 1):
        assert relative_error(got[k + 1], expected[k]) > bound
        assert relative_error(got[k][:n], other[k][:n]) > bound


def test_generates_the_oracles_greedy_token(engine):
    # Logits of a random model are close together; compare only where the runner-up trails by
    # more than the dtype's rounding could move it (bf16 logits carry about 3 significant digits).
    min_margin = {"float32": 1e-3}.get(engine.dtype, 2e-2)
    checked = 0
    for ids in sample_token_ids(engine.path, 12, start=10):
        out = engine.generate(ids, max_tokens=4)
        assert len(out) >= 1
        token, margin = engine.reference.next_token(ids)
        if margin > min_margin:
            assert out[0] == token
            checked += 1
    assert checked >= 4, f"only {checked} of 12 prompts had a clear greedy token"
