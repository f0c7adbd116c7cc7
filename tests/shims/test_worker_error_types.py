"""worker_error_types: the driver re-raises the worker's exception type."""

from __future__ import annotations

from speculators_compat.shims.worker_error_types import SHIM
from speculators_compat.worker_errors import MARKER, WorkerError, describe, from_text
from tests.helpers import run_generator


def test_without_it_the_detail_arrives_as_a_plain_runtime_error():
    result = run_generator("llama-tiny", 1, disable=SHIM.name, worker_assert=True)
    assert not result["ok"]
    assert result["mro"][0] == "RuntimeError" and "AssertionError" not in result["mro"]
    assert MARKER in result["message"]


def test_round_trip_keeps_type_message_and_traceback():
    try:
        {}["missing"]
    except KeyError as exc:
        text = f"Worker failed with error '{describe(exc)}', please check the stack trace above"
    err = from_text(text)
    assert isinstance(err, WorkerError) and isinstance(err, KeyError)
    assert err.message == "'missing'" and "test_round_trip" in err.worker_traceback
    assert from_text("Worker failed with error 'plain'") is None
