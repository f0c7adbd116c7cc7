"""preflight on the shipped Kimi-K2.5-like and DeepSeek-V3-like configs, in real vLLM (CPU)."""

from __future__ import annotations

import json

import pytest

from speculators_compat.diagnose.preflight import shrink
from speculators_compat.tiny import fixtures_dir
from tests.helpers import unsupported_reason
from tests.pipeline_helpers import cli

CONFIGS = fixtures_dir() / "preflight"


@pytest.mark.parametrize("name", ["deepseek-v3-config.json", "kimi-k25-config.json"])
def test_shrink_keeps_the_class_path_and_cuts_the_sizes(name):
    config = json.loads((CONFIGS / name).read_text())
    shrunk = shrink(config)
    recipe = shrunk.recipe
    assert recipe["architecture"] == config["architectures"][0]
    text = recipe["base"]["config"] if "base" in recipe else recipe["config"]
    real = config.get("text_config", config)
    for key in ("topk_method", "scoring_func", "routed_scaling_factor", "norm_topk_prob", "rope_scaling"):
        assert text[key] == real[key], key
    assert text["num_hidden_layers"] == 6 and text["hidden_size"] == 128
    assert any(w.startswith("quantization dropped") for w in shrunk.warnings)
    if "text_config" in config:
        assert recipe["wrapper"]["model_type"] == config["model_type"]
        assert recipe["wrapper"]["text_model_type"] == real["model_type"]


@pytest.mark.parametrize("name", ["deepseek-v3-config.json", "kimi-k25-config.json"])
def test_shrink_warns_that_vllm_ignores_rope_interleave_false(name):
    config = json.loads((CONFIGS / name).read_text())
    assert not any("rope_interleave" in w for w in shrink(config).warnings)
    text = config.get("text_config", config)
    text["rope_interleave"] = False
    assert any("rope_interleave: false, which vLLM ignores" in w for w in shrink(config).warnings)
    text["rope_interleave"] = True
    assert not any("rope_interleave" in w for w in shrink(config).warnings)


def test_preflight_deepseek_v3_like(tmp_path):
    # as on a developer's CPU machine: nothing of vLLM's exported (MLA, KV cache: the tool chooses)
    unset = {"VLLM_CPU_KVCACHE_SPACE": None, "VLLM_MLA_DISABLE": None}
    proc = cli("preflight", "--config", CONFIGS / "deepseek-v3-config.json", "--out", tmp_path, env=unset)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "quantization dropped (config.json: fp8)" in proc.stdout
    for step in ("build", "prepare", "extract", "vocab", "train (one step)"):
        assert f"ok     {step}" in proc.stdout
    assert "steps=1" in proc.stdout
    config = json.loads((tmp_path / "run" / "hidden_states" / "data_config.json").read_text())
    assert "training_target_final_norm" in config["speculators_compat"]["shims_applied"]


def test_preflight_kimi_k25_like(tmp_path):
    proc = cli("preflight", "--config", CONFIGS / "kimi-k25-config.json", "--out", tmp_path)
    assert "quantization dropped (text_config: compressed-tensors" in proc.stdout
    assert "KimiK25ForConditionalGeneration" in proc.stdout
    built = json.loads(next((tmp_path / "run").parent.glob("run/run.json")).read_text())["settings"]["model"]
    assert json.loads((__import__("pathlib").Path(built) / "config.json").read_text())["architectures"] == [
        "KimiK25ForConditionalGeneration"
    ]
    reason = unsupported_reason("KimiK25ForConditionalGeneration")
    if reason is None:
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
        assert "ok     train (one step)" in proc.stdout
        assert "draft_verifier_wrapper" in proc.stdout
    else:  # this vLLM cannot build it on CPU: preflight says so, with vLLM's own error
        assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-3000:]
        assert "ok     prepare" in proc.stdout and "FAILED extract" in proc.stdout
        assert "FAIL: preflight" in proc.stdout
