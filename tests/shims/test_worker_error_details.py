"""worker_error_details + worker_error_types: a bare assert in a worker reaches the caller."""

from __future__ import annotations

from speculators_compat.shims.worker_error_details import SHIM
from tests.helpers import run_generator


def test_without_it_the_caller_sees_an_empty_message():
    result = run_generator("llama-tiny", 1, disable=SHIM.name, worker_assert=True)
    assert not result["ok"]
    assert result["message"].startswith("Worker failed with error ''")
    assert "Worker failed with error ''" in SHIM.symptom


def test_with_it_the_caller_sees_type_message_and_worker_traceback():
    result = run_generator("llama-tiny", 1, worker_assert=True)
    assert not result["ok"]
    assert {"WorkerError", "AssertionError", "RuntimeError"} <= set(result["mro"])
    assert "AssertionError in a vLLM worker" in result["message"]
    assert "bare_assert" in result["message"] and "Traceback" in result["message"]
