"""Properties of the per-request attribution in speculators_compat.capture (no vLLM needed).

A toy model with the decoder-layer shape vLLM uses (``model.layers``, each returning
``(hidden, residual)``) runs batches laid out as vLLM's runner lays them out; hypothesis picks
how many requests, their lengths, and an arbitrary schedule: which requests run in each step,
in what order, with what chunk of their remaining tokens, split over one or two forward calls,
with padding rows after the real ones.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from speculators_compat.capture import CaptureState, unpack_states
from tests.helpers import run_python


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


def _take(capture: CaptureState, req_ids: list[str], via: str) -> dict:
    if via == "packed":  # as the worker sends them and the driver reads them
        return unpack_states(pickle.loads(pickle.dumps(capture.take_packed(req_ids), protocol=5)))
    return capture.take(req_ids)


@settings(max_examples=200, deadline=None)
@given(
    schedules(),
    st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True),
    st.sampled_from(["take", "packed"]),
)
def test_every_request_gets_exactly_its_tokens_in_order(schedule, layer_ids, via):
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
    states = _take(capture, req_ids, via)
    for i, n in enumerate(lengths):
        for pos, layer in enumerate(sorted(set(layer_ids))):
            expected = torch.arange(n, dtype=torch.float32) + i * 100 + 1000.0 * layer
            assert torch.equal(states[req_ids[i]][pos][:, 0], expected)
    assert capture.take(req_ids) == {}  # taken once


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=6),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    st.integers(1, 64),
)
def test_packed_states_round_trip_bit_for_bit_and_each_request_owns_its_storage(lengths, dtype, hidden):
    capture = CaptureState(_Toy(2), [0, 1])
    req_ids = [f"req_0_{i}" for i in range(len(lengths))]
    counts = dict(zip(req_ids, lengths, strict=True))
    sent = {r: [torch.randn(n, hidden).to(dtype) for _ in range(2)] for r, n in counts.items()}
    capture.begin_step()
    for pos in range(2):  # each request's rows filed as the worker files them, in one step
        capture.step[pos].append(torch.cat([sent[r][pos] for r in req_ids]))
    capture.end_step(req_ids, counts)

    packed = capture.take_packed([*req_ids, "never_scheduled"])
    assert packed["req_ids"] == req_ids
    received = unpack_states(pickle.loads(pickle.dumps(packed, protocol=5)))
    for r in req_ids:
        for got, want in zip(received[r], sent[r], strict=True):
            assert got.dtype == dtype and torch.equal(got, want)
            # torch.save of one sample writes its own rows, not the whole batch
            assert got.untyped_storage().nbytes() == got.numel() * got.element_size()
    assert capture.requests == {}


def test_large_states_leave_the_pickle_stream_out_of_band_and_one_step_is_not_copied():
    """vLLM's message queue sends pickle-5 buffers of 1 MiB or more without copying them; a
    request prefilled in one step is sent as a view of that step's rows (no copy in the
    worker), one prefilled in two steps as its chunks joined."""
    capture = CaptureState(_Toy(1), [0])
    capture.begin_step()
    step = torch.randn(2048, 256)  # 2 MiB of float32
    capture.step[0].append(step)
    capture.end_step(["a", "b"], {"a": 1000, "b": 1048})
    capture.begin_step()
    capture.step[0].append(torch.randn(24, 256))
    capture.end_step(["b"], {"b": 24})
    packed = capture.take_packed(["a", "b"])
    a, b = packed["layers"][0]["arrays"]
    assert a.ctypes.data == step.data_ptr()  # a's rows themselves
    assert b.shape == (1072, 256 * 4)
    assert not step.data_ptr() <= b.ctypes.data < step.data_ptr() + step.nbytes  # joined: a copy
    buffers = []
    stream = pickle.dumps(packed, protocol=5, buffer_callback=buffers.append)
    assert len(stream) < 4096
    assert [b.raw().nbytes for b in buffers] == [1000 * 256 * 4, 1072 * 256 * 4]


def _received(packed, transport: str):
    """``packed`` as the driver receives it from vLLM's message queue: out-of-band buffers laid
    into its shared-memory ring (an mmap the next message overwrites), or sent as zmq frames
    (a message too large for the ring)."""
    import mmap

    import zmq

    buffers = []
    stream = pickle.dumps(packed, protocol=5, buffer_callback=buffers.append)
    if transport == "ring":
        ring = mmap.mmap(-1, sum(b.raw().nbytes for b in buffers))
        view, offset, laid = memoryview(ring), 0, []
        for buf in buffers:
            raw = buf.raw()
            view[offset : offset + raw.nbytes] = raw
            laid.append(view[offset : offset + raw.nbytes])
            offset += raw.nbytes
        return pickle.loads(stream, buffers=laid), view
    context = zmq.Context.instance()
    sender, receiver = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    receiver.bind("inproc://states")
    sender.connect("inproc://states")
    sender.send_multipart([stream, *buffers], copy=False)
    main, *frames = receiver.recv_multipart(copy=False)
    sender.close()
    receiver.close()
    return pickle.loads(main, buffers=frames), None


@pytest.mark.parametrize("transport", ["ring", "zmq"])
def test_unpacked_states_copy_what_the_ring_reuses_and_nothing_else(transport):
    capture = CaptureState(_Toy(2), [0, 1])
    capture.begin_step()
    sent = [torch.randn(3000, 128), torch.randn(3000, 128)]  # 1.5 MiB a layer
    for pos in range(2):
        capture.step[pos].append(sent[pos])
    capture.end_step(["a", "b"], {"a": 1000, "b": 2000})
    packed, ring = _received(capture.take_packed(["a", "b"]), transport)
    arrays = [array for layer in packed["layers"] for array in layer["arrays"]]
    received = unpack_states(packed)
    if ring is not None:
        ring[:] = b"\0" * ring.nbytes  # the next message
    for pos in range(2):
        assert torch.equal(received["a"][pos], sent[pos][:1000])
        assert torch.equal(received["b"][pos], sent[pos][1000:])
    got = [t.data_ptr() for t in (received["a"][0], received["b"][0], received["a"][1], received["b"][1])]
    shared = [p == a.ctypes.data for p, a in zip(got, arrays, strict=True)]
    assert shared == [transport == "zmq"] * 4


def test_a_view_of_a_larger_buffer_is_copied():
    """Only memory that holds nothing but the array is kept: a view into a larger array, or
    into memory of an unknown kind, is copied."""
    import numpy as np

    whole = np.arange(4096, dtype=np.uint8).reshape(8, 512)
    packed = {"req_ids": ["a"], "layers": [{"dtype": "float32", "arrays": [whole[2:4]]}]}
    (state,) = unpack_states(packed)["a"]
    assert state.data_ptr() != whole[2:4].ctypes.data
    assert state.view(torch.uint8).numpy().tobytes() == whole[2:4].tobytes()


def test_out_of_range_layer_ids_name_the_valid_range():
    with pytest.raises(ValueError, match=r"layer ids \[6\] are out of range: the model has 6 decoder layers"):
        CaptureState(_Toy(6), [2, 6])


def test_a_step_without_captured_rows_is_an_error_not_a_silent_gap():
    capture = CaptureState(_Toy(3), [1])
    capture.begin_step()
    with pytest.raises(RuntimeError, match="no hidden states were captured for layer 1"):
        capture.end_step(["a"], {"a": 4})


_HEAP = """
import json, psutil, torch
from speculators_compat.capture import _malloc_trim, release_free_memory
if _malloc_trim() is None:
    print(json.dumps({"glibc": False}), flush=True)
    raise SystemExit
# 256 MiB in 64 KiB tensors (under glibc's mmap threshold: they come from the heap), all freed
# but the last, which pins the heap's top so that free() alone cannot shrink it.
chunks = [torch.ones(16384) for _ in range(4096)]
last = chunks[-1]
del chunks
rss = psutil.Process().memory_info().rss
release_free_memory()
print(json.dumps({"glibc": True, "freed": rss - psutil.Process().memory_info().rss}), flush=True)
"""


def test_release_free_memory_gives_freed_heap_pages_back():
    out = run_python(_HEAP)
    if not out["glibc"]:
        pytest.skip("not glibc: release_free_memory does nothing here")
    assert out["freed"] > 128 * 2**20, out


def test_memory_is_released_once_per_budget_of_states_taken(monkeypatch):
    import speculators_compat.capture as capture_module

    calls = []
    monkeypatch.setattr(capture_module, "release_free_memory", lambda: calls.append(1))
    monkeypatch.setattr(capture_module, "RELEASE_EVERY_BYTES", 3 * 4096)
    capture = CaptureState(_Toy(1), [0])
    for batch in range(7):  # 4 KiB of float32 states per batch
        capture.release_memory_now_and_then()
        capture.begin_step()
        capture.step[0].append(torch.zeros(8, 128))
        capture.end_step([f"r{batch}"], {f"r{batch}": 8})
        capture.take_packed([f"r{batch}"])
    assert len(calls) == 2  # before batches 3 and 6 (0-based), after 12 KiB each time
    assert capture.taken_since_release == 4096


def test_a_sample_saves_only_its_own_rows_and_copies_nothing_it_owns(tmp_path):
    """extract's record: a view into a batch tensor is copied (torch.save writes whole storages),
    a tensor that owns its storage (unpack_states' result) is saved as it is."""
    from speculators_compat.pipeline.samples import sample_record

    batch = torch.randn(1000, 64)
    view, owned = batch[10:20], torch.randn(10, 64)
    sample = sample_record(list(range(10)), [view, owned], [1] * 10)
    assert sample["hidden_states"][1] is owned
    copied = sample["hidden_states"][0]
    assert torch.equal(copied, view) and copied.untyped_storage().nbytes() == view.nbytes
    torch.save(sample, tmp_path / "data_0.pt")
    assert (tmp_path / "data_0.pt").stat().st_size < batch.nbytes / 10
