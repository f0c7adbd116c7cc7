"""cpu_mla_attention: DeepSeek/Kimi attention as MLA where the CPU build runs it, off elsewhere."""

from __future__ import annotations

import os
import re

import pytest
import torch

from speculators_compat import cpu_mla
from speculators_compat.oracle.reference import TOLERANCE
from speculators_compat.shims.cpu_mla_attention import SHIM
from tests.helpers import run_generator

#: What vLLM's worker says without the shim: builds without CPU MLA refuse it; builds with it
#: take the 48-wide latent of deepseek-v3-tiny into AMX_MLA (CPUs with AMX) or CPU_MLA (others).
WITHOUT = re.compile(
    r"MLA is not supported on CPU\."
    r"|invalid weight input features 48"
    r"|Head dimension 48 is not supported by MLA"
)


def _amx() -> bool:
    return torch.cpu._is_amx_tile_supported()


def test_without_it_deepseek_does_not_start_on_cpu_and_with_it_states_match():
    without = run_generator("deepseek-v3-tiny", 2, disable=SHIM.name)
    assert not without["ok"]
    assert WITHOUT.search(without["output"]), without["output"][-3000:]
    with_it = run_generator("deepseek-v3-tiny", 2)
    assert with_it["ok"], with_it.get("message")
    assert max(with_it["errors"]) <= TOLERANCE["float32"]
    assert with_it["status"][SHIM.name] == "applied"


def test_with_cpu_mla_a_float32_model_runs_mla_through_the_kernel_that_takes_float32():
    from speculators_compat.tiny import build

    choice = cpu_mla.choose(build("deepseek-v3-tiny-mla"))
    if not choice.use_mla:
        pytest.skip(choice.reason)
    if not _amx():
        pytest.skip("without AMX vLLM picks CPU_MLA itself: the float32 failure needs a CPU with AMX")
    without = run_generator("deepseek-v3-tiny-mla", 2, disable=SHIM.name)
    assert not without["ok"]
    assert "expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8" in without["output"]
    with_it = run_generator("deepseek-v3-tiny-mla", 2)
    assert with_it["ok"], with_it.get("message")
    assert max(with_it["errors"]) <= TOLERANCE["float32"]


@pytest.fixture
def clean_env(monkeypatch):
    """Neither variable set; both put back as they were afterwards, whatever apply() sets.
    (monkeypatch.delenv of an unset variable records nothing to restore: set it first.)"""
    for name in (cpu_mla.ENV, cpu_mla.OWNED_ENV):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


def test_a_vllm_mla_disable_the_user_set_stands(clean_env):
    monkeypatch = clean_env
    on = cpu_mla.MlaChoice(True, cpu_mla.BACKEND, "test: on")
    off = cpu_mla.MlaChoice(False, None, "test: off")
    monkeypatch.setenv(cpu_mla.ENV, "1")  # the user's
    assert cpu_mla.apply(on) is None  # their MLA-off stands: no backend requested either
    assert cpu_mla.apply(off) == off
    monkeypatch.delenv(cpu_mla.ENV)
    assert cpu_mla.apply(on) == on
    assert os.environ[cpu_mla.ENV] == "0"
    assert cpu_mla.apply(off) == off  # ours: changed per model
    assert os.environ[cpu_mla.ENV] == "1"


def test_a_subprocess_makes_its_own_choice_after_ours(clean_env):
    """The choice made here for a model with MLA (VLLM_MLA_DISABLE=0) is inherited by a process
    started from this one; that process must not take it for the user's (CI, vLLM 0.32 without
    AMX: after the -mla engine tests, deepseek-v3-tiny (latent 48) was started with MLA on and its
    worker died: "Head dimension 48 is not supported by MLA.")."""
    from tests.helpers import run_python

    on = cpu_mla.MlaChoice(True, cpu_mla.BACKEND, "test: on")
    assert cpu_mla.apply(on) == on
    child = run_python(
        """
        import json, os
        from speculators_compat import cpu_mla
        off = cpu_mla.MlaChoice(False, None, "test: off")
        print(json.dumps({"applied": cpu_mla.apply(off) == off, "env": os.environ[cpu_mla.ENV]}))
        """
    )
    assert child == {"applied": True, "env": "1"}


def test_these_tests_leave_the_environment_as_they_found_it():
    """(CI, vLLM 0.16: the two tests above once left VLLM_MLA_DISABLE=0 marked as the user's,
    and every later DeepSeek engine in the run died: "MLA is not supported on CPU.")"""
    assert cpu_mla.ENV not in os.environ or os.environ.get(cpu_mla.OWNED_ENV) == os.environ[cpu_mla.ENV]
