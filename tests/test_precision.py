"""``train --precision`` and ``--num-workers``: what training runs in and loads with on a CPU and a
GPU, and that the precision changes torch's global matmul setting only while training runs (no
engine, no training: seconds; training in fp32 is checked against the demo's losses in
tests/test_pipeline.py, the GPU figures are in docs/performance.md)."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from speculators_compat.pipeline.errors import PipelineError
from speculators_compat.pipeline.train import PRECISIONS, chosen_precision, matmul_precision


def test_the_default_is_tf32_on_a_cuda_gpu_and_fp32_on_a_cpu():
    assert chosen_precision(None, "cuda") == "tf32"
    assert chosen_precision(None, "cpu") == "fp32"
    for p in PRECISIONS:
        assert chosen_precision(p, "cuda") == p


def test_tf32_asked_for_on_a_cpu_trains_in_fp32_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="speculators_compat.pipeline"):
        assert chosen_precision("tf32", "cpu") == "fp32"
    assert "applies to CUDA GPUs" in caplog.text


def test_an_unknown_precision_is_refused_naming_the_choices():
    with pytest.raises(PipelineError, match="fp32, tf32"):
        chosen_precision("fp8", "cuda")


@pytest.mark.parametrize(("precision", "inside"), [("tf32", "high"), ("fp32", "highest")])
def test_the_matmul_setting_holds_inside_training_only(precision, inside):
    before = torch.get_float32_matmul_precision()
    with matmul_precision(precision):
        assert torch.get_float32_matmul_precision() == inside
        if torch.cuda.is_available():
            assert torch.backends.cuda.matmul.allow_tf32 == (precision == "tf32")
    assert torch.get_float32_matmul_precision() == before
    with pytest.raises(RuntimeError), matmul_precision(precision):
        raise RuntimeError("a failed step")
    assert torch.get_float32_matmul_precision() == before


@pytest.mark.parametrize(("cpus", "workers"), [(16, 4), (3, 2), (2, 1), (1, 0)])
def test_loader_workers_run_beside_the_step_on_a_gpu_only(monkeypatch, cpus, workers):
    """On a GPU up to GPU_LOADER_WORKERS, one CPU left to the training process; on a CPU none."""
    from speculators_compat.pipeline.train import GPU_LOADER_WORKERS, loader_workers

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cpus)), raising=False)
    assert GPU_LOADER_WORKERS == 4
    assert loader_workers(None, "cuda") == workers
    assert loader_workers(None, "cpu") == 0
    assert loader_workers(3, "cpu") == loader_workers(3, "cuda") == 3
