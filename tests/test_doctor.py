"""doctor: every API point of speculators 0.3.0 on this vLLM, without loading a model."""

from __future__ import annotations

import pytest

from tests.helpers import run_python
from tests.pipeline_helpers import cli


def test_no_uncovered_drift_on_this_vllm():
    proc = cli("doctor")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " 0 UNCOVERED" in proc.stdout
    assert "Request(...)" in proc.stdout and "model DeepseekV3ForCausalLM: decoder layer call" in proc.stdout


# vLLM altered before speculators_compat is imported: its shims probe what the drift left (the
# vLLM 0.11/0.12 CPU builds' metadata alias is already in place: tests/conftest.py).
DRIFT = """
import json
import vllm.v1.request as request
{alteration}
from speculators_compat.diagnose.doctor import diagnose
findings = {{f.point.name: (f.state, f.evidence) for f in diagnose()}}
from speculators_compat.cli import main
try:
    main(["doctor"], standalone_mode=False)
    code = 0
except SystemExit as exc:
    code = exc.code
print(json.dumps({{"findings": findings, "code": code}}))
"""


def test_a_changed_constructor_is_reported_with_its_evidence():
    alteration = """
original = request.Request.__init__
def __init__(self, request_id, prompt_token_ids, sampling_params, pooling_params, eos_token_id,
             arrival_time, prompt_hasher, **kwargs):
    original(self, request_id, prompt_token_ids, sampling_params, pooling_params, eos_token_id,
             arrival_time, **kwargs)
request.Request.__init__ = __init__
"""
    result = run_python(DRIFT.format(alteration=alteration))
    state, evidence = result["findings"]["Request(...)"]
    assert state == "UNCOVERED" and "requires prompt_hasher" in evidence
    assert result["code"] == 1


def test_a_removed_name_is_reported():
    alteration = """
import enum
names = [m for m in request.RequestStatus.__members__ if m != "FINISHED_ABORTED"]
request.RequestStatus = enum.Enum("RequestStatus", names)
"""
    result = run_python(DRIFT.format(alteration=alteration))
    state, evidence = result["findings"]["RequestStatus.FINISHED_ABORTED"]
    assert state == "UNCOVERED" and "FINISHED_ABORTED" in evidence
    assert result["code"] == 1


def test_a_module_that_does_not_import_here_is_unknown_not_drift():
    """A CUDA wheel read on a machine without a GPU: a model module that exists but fails to
    import (as vLLM 0.34's did here with a mismatched cuda-python: "module 'cuda.bindings.runtime'
    has no attribute 'cudaLibrary_t'") is reported unknown, with the error, never a crash."""
    alteration = """
import sys
KIMI = "vllm.model_executor.models.kimi_k25"
sys.modules.pop(KIMI, None)
class CudaOnly:
    def find_spec(self, name, path=None, target=None):
        if name == KIMI:
            raise AttributeError("module 'cuda.bindings.runtime' has no attribute 'cudaLibrary_t'")
sys.meta_path.insert(0, CudaOnly())
"""
    result = run_python(DRIFT.format(alteration=alteration))
    state, evidence = result["findings"]["model KimiK25ForConditionalGeneration"]
    if state == "absent":  # vLLM < 0.15 has no Kimi-K2.5 (the registry says so before any import)
        pytest.skip(evidence)
    assert state == "unknown", (state, evidence)
    assert "does not import here" in evidence and "cudaLibrary_t" in evidence
    state, _ = result["findings"]["model DeepseekV3ForCausalLM"]
    assert state == "matches"


def test_every_shim_shows_in_doctor_and_a_disabled_ones_drift_is_uncovered():
    """Every shim is named by a point (an API point, or its own probe's), so a drift a shim fixes
    never goes unseen; with a shim disabled, its drift is UNCOVERED (its probe runs on vLLM's own
    objects: nothing of it is patched) and doctor exits 1."""
    from speculators_compat.shims import SHIMS

    code = DRIFT.format(alteration="").replace(
        "findings = {", "named = sorted({s for f in diagnose() for s in f.point.shims})\nfindings = {"
    )
    code = code.replace('"code": code})', '"code": code, "named": named})')
    result = run_python(
        code, env={"SPECULATORS_COMPAT_DISABLE": "worker_error_details,executor_sample_tokens"}
    )
    assert result["named"] == sorted(shim.name for shim in SHIMS)
    state, evidence = result["findings"]["shim worker_error_details"]
    assert state == "UNCOVERED" and "Worker failed with error ''" in evidence
    state, evidence = result["findings"]["execute_model convention"]
    from speculators_compat.shims import BY_NAME
    from speculators_compat.versions import in_range, installed_versions

    if in_range(installed_versions().vllm, BY_NAME["executor_sample_tokens"].vllm):
        assert state == "UNCOVERED" and "sample_tokens() must follow" in evidence
    else:  # 0.11.0: execute_model still returns the output
        assert state == "matches", (state, evidence)
    assert result["findings"]["collective_rpc reply"][0] in ("shimmed", "matches")
    assert result["code"] == 1
