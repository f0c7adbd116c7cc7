"""generator_cpu_memory: speculators sizes the KV cache with torch.cuda on a CPU machine."""

from __future__ import annotations

import pytest
import torch

from speculators_compat.shims.generator_cpu_memory import SHIM
from tests.helpers import run_generator

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-backend shim")


def test_without_it_the_generator_needs_an_nvidia_driver():
    result = run_generator("llama-tiny", 1, disable=SHIM.name)
    assert not result["ok"]
    assert "Found no NVIDIA driver on your system" in result["message"]
    assert "Found no NVIDIA driver on your system" in SHIM.symptom
