"""cpu_kv_cache: with VLLM_CPU_KVCACHE_SPACE unset, vLLM's CPU engines (the serving and
regenerating engines, speculators' generator) get the KV cache they need, not half the memory."""

from __future__ import annotations

import pytest
import torch

from speculators_compat.cpu_kv_cache import ENV, GIB, OWNED_ENV, vllm_default_bytes
from speculators_compat.tiny import build
from tests.helpers import run_python

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="vLLM's CPU backend")


@pytest.fixture
def unset(monkeypatch):
    """Neither variable set here; both restored after (setenv first: monkeypatch.delenv of an
    unset variable records nothing to restore)."""
    for name in (ENV, OWNED_ENV):
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)


def test_a_serving_engine_gets_what_it_needs_and_the_users_value_stands(unset, monkeypatch, caplog):
    from speculators_compat.pipeline.serve import run_engine

    model = build("llama-tiny", "float32")
    request = {
        "verifier": str(model),
        "dtype": "float32",
        "max_model_len": 256,
        "max_num_seqs": 4,
        "max_tokens": 2,
        "prompts": [[1, 2, 3, 4]],
    }
    with caplog.at_level("INFO", logger="speculators_compat"):
        chosen = run_engine(request)
    assert chosen["kv_cache_bytes"] == GIB, chosen["kv_cache_bytes"]
    assert vllm_default_bytes() > 2 * GIB  # vLLM alone would have taken more (every machine here)
    assert "KV cache on CPU: 1 GiB: 4 sequences of 256 tokens" in caplog.text
    assert "half the memory" in caplog.text

    monkeypatch.setenv(ENV, "2")  # the user's: it stands
    theirs = run_engine(request)
    assert theirs["kv_cache_bytes"] == 2 * GIB


@pytest.mark.parametrize("recipe", ["llama-tiny", "deepseek-v3-tiny"])
def test_the_generator_gets_what_it_needs_and_the_estimate_bounds_vllms_own(recipe):
    """speculators' generator with the variable unset: the cache is the chosen 1 GiB (not a
    16% of the free memory), and our bytes-per-token estimate is at least vLLM's own (from the
    workers' KV-cache spec), so the size chosen for a real model always holds what it says."""
    result = run_python(
        f"""
        import json, os
        import speculators_compat
        from speculators_compat.cpu_alias import ensure_vllm_cpu_alias
        ensure_vllm_cpu_alias()
        from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator
        from speculators_compat import cpu_mla
        from speculators_compat.cpu_kv_cache import bytes_per_token
        from speculators_compat.tiny import build

        path = build({recipe!r}, "float32")
        gen = VllmHiddenStatesGenerator(str(path), layer_ids=[1, 2, 3], max_model_len=256)
        specs = gen.executor.collective_rpc("get_kv_cache_spec")[0].values()
        vllm_per_token = sum(s.page_size_bytes // s.block_size for s in specs)
        page = sum(s.page_size_bytes for s in specs)
        mla = cpu_mla.choose(path)
        ours = bytes_per_token(path, use_mla=mla is not None and mla.use_mla)
        print(json.dumps({{
            "env": os.environ.get({ENV!r}), "owned": os.environ.get({OWNED_ENV!r}),
            "cache_bytes": gen.vllm_config.cache_config.num_gpu_blocks * page,
            "vllm_per_token": vllm_per_token, "ours": ours,
        }}), flush=True)
        gen.executor.shutdown()
        """,
        env={ENV: None, OWNED_ENV: None},
    )
    assert result["env"] == result["owned"] == "1", result
    assert 0.9 * GIB <= result["cache_bytes"] <= GIB, result
    assert result["vllm_per_token"] <= result["ours"] <= 2 * result["vllm_per_token"], result
