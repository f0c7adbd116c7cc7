"""extract writes each batch's files on a thread while the next batch is generated
(pipeline.samples.BatchWriter): overlap, at most one batch in flight, errors that stop the run,
and files that are whole or absent."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from speculators_compat.pipeline.atomic import DiskFull
from speculators_compat.pipeline.samples import BatchWriter, existing_samples, write_batch


def _batch(first: int, count: int, tokens: int = 5):
    chunk = list(range(first, first + count))
    rows = [{"loss_mask": [1] * tokens} for _ in chunk]
    results = [
        {"input_ids": torch.arange(tokens) + i, "hidden_states": [torch.full((tokens, 8), float(i))] * 2}
        for i in chunk
    ]
    return chunk, rows, results


def test_a_batch_is_written_while_the_next_is_made_and_one_at_a_time(tmp_path):
    release = threading.Event()
    running = []

    def slow_write(chunk, rows, results):
        running.append(threading.get_ident())
        assert release.wait(10)
        return write_batch(tmp_path, chunk, rows, results)

    writer = BatchWriter()
    try:
        started = time.monotonic()
        assert writer.submit(lambda: slow_write(*_batch(0, 3))) == 0  # returns at once
        assert time.monotonic() - started < 1.0
        assert not existing_samples(tmp_path)  # ... while the batch is still being written
        threading.Timer(0.3, release.set).start()
        # the next submit waits for the batch before it: at most one in flight
        assert writer.submit(lambda: write_batch(tmp_path, *_batch(3, 2))) == 3
        assert writer.finish() == 2
    finally:
        writer.close()
    assert existing_samples(tmp_path) == set(range(5))
    assert running and running[0] != threading.get_ident()
    sample = torch.load(tmp_path / "data_4.pt", weights_only=True)
    assert sample["input_ids"].tolist() == [4, 5, 6, 7, 8]
    assert torch.equal(sample["hidden_states"][1], torch.full((5, 8), 4.0))


def test_a_failed_write_stops_the_run_and_keeps_what_was_written(tmp_path, monkeypatch):
    real_save = torch.save

    def save(obj, path, *args, **kwargs):
        if "data_4.pt" in str(path):
            raise OSError(28, "No space left on device")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    writer = BatchWriter()
    try:
        writer.submit(lambda: write_batch(tmp_path, *_batch(0, 3)))
        writer.submit(lambda: write_batch(tmp_path, *_batch(3, 3)))
        # out of space: the run's clear error (atomic.DiskFull), naming the file, the cause kept
        with pytest.raises(DiskFull, match=r"is full .* writing data_4\.pt \(OSError: \[Errno 28\]"):
            writer.finish()
    finally:
        writer.close()
    assert existing_samples(tmp_path) == {0, 1, 2, 3}  # before the failure: all of it, whole
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_closing_after_an_error_elsewhere_lets_the_batch_land(tmp_path):
    writer = BatchWriter()
    writer.submit(lambda: (time.sleep(0.2), write_batch(tmp_path, *_batch(0, 2)))[1])
    writer.close()  # e.g. the generator raised: the batch in flight still lands
    assert existing_samples(tmp_path) == {0, 1}


def test_a_batch_whose_states_do_not_cover_their_tokens_stops_before_it_is_written():
    """speculators 0.3.0's offset slicing under chunked prefill (speculators #279, the
    token_attribution shim off): the batch's last samples come back short and the rest hold other
    sequences' rows. The check names the samples and what is kept (tests/test_ablations.py runs it
    in vLLM)."""
    from speculators_compat.pipeline.errors import PipelineError
    from speculators_compat.pipeline.samples import check_batch

    chunk, rows, results = _batch(10, 3)
    for row, result in zip(rows, results, strict=True):
        row["input_ids"] = result["input_ids"].tolist()
    check_batch(chunk, rows, results, kept=10)  # whole: passes
    results[2]["hidden_states"] = [h[:3] for h in results[2]["hidden_states"]]
    with pytest.raises(PipelineError, match=r"1 of 3 samples .*sample 12: 5 tokens, states \[3, 3\]") as exc:
        check_batch(chunk, rows, results, kept=10)
    message = str(exc.value)
    assert "token_attribution" in message and "the 10 samples already on disk are kept" in message
    results[2]["hidden_states"] = results[1]["hidden_states"]
    results[2]["input_ids"] = results[1]["input_ids"]  # another sequence's ids: not this sample's
    with pytest.raises(PipelineError, match="sample 12"):
        check_batch(chunk, rows, results, kept=10)
