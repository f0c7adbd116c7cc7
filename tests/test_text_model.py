"""One rule for where a checkpoint's text model is (speculators_compat/text_model.py), used by
extraction's model info, the transformers oracle, preflight, the draft's verifier and training."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from speculators_compat import text_model
from speculators_compat.oracle.reference import is_multimodal_wrapper
from speculators_compat.pipeline.model_info import inspect_model

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"num_hidden_layers": 3, "hidden_size": 64, "vocab_size": 100}
INNER = {"num_hidden_layers": 7, "hidden_size": 128, "vocab_size": 200, "model_type": "deepseek_v3"}


@given(top_sizes=st.booleans(), has_text=st.booleans())
def test_a_dict_and_a_transformers_config_get_the_same_answer(top_sizes, has_text):
    from transformers import PretrainedConfig

    raw = {**(SIZES if top_sizes else {}), **({"text_config": dict(INNER)} if has_text else {})}
    config = PretrainedConfig(**raw)
    assert text_model.is_wrapper(raw) == text_model.is_wrapper(config) == (has_text and not top_sizes)
    if has_text and not top_sizes:
        assert text_model.text_config(raw) == INNER
        assert text_model._get(text_model.text_config(config), "hidden_size") == INNER["hidden_size"]
    else:
        assert text_model.text_config(raw) is raw and text_model.text_config(config) is config


def test_a_config_with_both_is_read_at_the_top_level_everywhere(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({**SIZES, "architectures": ["DeepseekV3ForCausalLM"], "text_config": INNER})
    )
    info = inspect_model(tmp_path)
    assert not info.wrapper and (info.num_layers, info.hidden_size) == (3, 64)
    assert not is_multimodal_wrapper(tmp_path)

    assert text_model.read_text_config(tmp_path)["hidden_size"] == 64


def test_a_wrapper_is_read_in_its_text_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["KimiK25"], "text_config": INNER}))
    info = inspect_model(tmp_path)
    assert info.wrapper and (info.num_layers, info.hidden_size) == (7, 128)
    assert is_multimodal_wrapper(tmp_path)


def test_no_other_module_decides_by_itself():
    """Only text_model.py reads ``text_config`` to decide (the tiny builders write it)."""
    for path in sorted((ROOT / "speculators_compat").rglob("*.py")):
        if path.name == "text_model.py" or path.parent.name == "tiny":
            continue
        code = re.sub(r'""".*?"""|#[^\n]*', "", path.read_text(), flags=re.DOTALL)
        rule = r"\.text_config\b(?!\()|\[.text_config.\]|get\(.text_config.|getattr\([^)]*.text_config."
        assert not re.search(rule, code), path
