"""Properties of the per-request attribution in speculators_compat.capture (no vLLM needed).

A toy model with the decoder-layer shape vLLM uses (``model.layers``, each returning
``(hidden, residual)``) runs batches laid out as vLLM's runner lays them out; hypothesis picks
how many requests, their lengths, and an arbitrary schedule: which requests run in each step,
in what order, with what chunk of their remaining tokens, split over one or two forward calls,
with padding rows after the real ones.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from speculators_compat.capture import CaptureState


class _Layer(torch.nn.Module):
    def __init__(self, index: int):
        super().__init__()
        self.index = index

    def forward(self, hidden):
        # output = hidden + residual = input + 1000 * index: identifies the layer too
        return hidden, torch.full_like(hidden, 1000.0 * self.index)


class _Toy(torch.nn.Module):
    def __init__(self, n_layers: int):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(_Layer(i) for i in range(n_layers))

    def forward(self, x):
        for layer in self.model.layers:
            h, r = layer(x)
        return h + r


@st.composite
def schedules(draw):
    lengths = draw(st.lists(st.integers(1, 40), min_size=1, max_size=12))
    done = [0] * len(lengths)
    steps = []
    while any(d < n for d, n in zip(done, lengths, strict=True)):
        pending = [i for i, (d, n) in enumerate(zip(done, lengths, strict=True)) if d < n]
        chosen = draw(st.lists(st.sampled_from(pending), min_size=1, unique=True))
        order = draw(st.permutations(chosen))
        step = []
        for i in order:
            take = draw(st.integers(1, lengths[i] - done[i]))
            step.append((i, done[i], take))
            done[i] += take
        steps.append((step, draw(st.booleans()), draw(st.integers(0, 3))))
    return lengths, steps


@settings(max_examples=200, deadline=None)
@given(schedules(), st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True))
def test_every_request_gets_exactly_its_tokens_in_order(schedule, layer_ids):
    lengths, steps = schedule
    model = _Toy(6)
    capture = CaptureState(model, layer_ids)
    req_ids = [f"req_0_{i:02d}" for i in range(len(lengths))]
    for step, split_forward, padding in steps:
        values = [float(i * 100 + start + k) for i, start, take in step for k in range(take)]
        rows = torch.tensor([[v] for v in values] + [[-1.0]] * padding)
        capture.begin_step()
        if split_forward and len(rows) > 1:  # two forward passes within one step
            model(rows[: len(rows) // 2])
            model(rows[len(rows) // 2 :])
        else:
            model(rows)
        capture.end_step([req_ids[i] for i, _, _ in step], {req_ids[i]: take for i, _, take in step})
    states = capture.take(req_ids)
    for i, n in enumerate(lengths):
        for pos, layer in enumerate(sorted(set(layer_ids))):
            expected = torch.arange(n, dtype=torch.float32) + i * 100 + 1000.0 * layer
            assert torch.equal(states[req_ids[i]][pos][:, 0], expected)
    assert capture.take(req_ids) == {}  # taken once


def test_out_of_range_layer_ids_name_the_valid_range():
    with pytest.raises(ValueError, match=r"layer ids \[6\] are out of range: the model has 6 decoder layers"):
        CaptureState(_Toy(6), [2, 6])


def test_a_step_without_captured_rows_is_an_error_not_a_silent_gap():
    capture = CaptureState(_Toy(3), [1])
    capture.begin_step()
    with pytest.raises(RuntimeError, match="no hidden states were captured for layer 1"):
        capture.end_step(["a"], {"a": 4})
