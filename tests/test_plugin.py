"""Worker processes started by spawn apply the shims through the vllm.general_plugins entry point."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from tests.helpers import run_generator

pytestmark = pytest.mark.engine

SPAWN = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}


def test_the_entry_point_is_installed():
    names = {ep.name: ep.value for ep in md.entry_points(group="vllm.general_plugins")}
    assert names.get("speculators_compat") == "speculators_compat.plugin:register"


def test_spawned_workers_capture_through_the_plugin_and_fail_without_it():
    with_plugin = run_generator("deepseek-v3-tiny", 4, env=SPAWN)
    assert with_plugin["ok"], with_plugin.get("message")
    assert max(with_plugin["errors"]) <= 5e-3
    # vLLM loads only the plugins VLLM_PLUGINS names: without ours, a spawned worker runs
    # speculators 0.3.0's own capture, which refuses DeepSeek.
    without = run_generator("deepseek-v3-tiny", 4, env={**SPAWN, "VLLM_PLUGINS": "no_such_plugin"})
    assert not without["ok"]
    # the worker's own error, as speculators' capture meets it (0.32: DeepSeek passes the gate)
    assert (
        "does not support hidden state extraction" in without["message"]
        or "get_input_embeddings" in without["message"]
        or "WorkerProc initialization failed" in without["message"]
    ), without["message"]
