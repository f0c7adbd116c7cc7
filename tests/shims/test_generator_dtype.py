"""generator_dtype: SPECULATORS_COMPAT_DTYPE instead of vLLM's dtype='auto'."""

from __future__ import annotations

from speculators_compat.oracle.reference import TOLERANCE
from speculators_compat.shims.generator_dtype import SHIM
from tests.helpers import run_generator


def test_without_it_a_float32_checkpoint_is_extracted_in_half_precision():
    without = run_generator("llama-tiny", 2, disable=SHIM.name)
    with_it = run_generator("llama-tiny", 2)
    assert without["ok"] and with_it["ok"]
    assert min(without["errors"]) > TOLERANCE["float32"]  # bf16 rounding, ~1e-2
    assert max(with_it["errors"]) <= TOLERANCE["float32"]


def test_the_choice_is_scoped_and_the_exported_variable_is_the_default(monkeypatch):
    from speculators_compat.settings import DTYPE_ENV as ENV
    from speculators_compat.settings import chosen_dtype, extraction_dtype

    monkeypatch.delenv(ENV, raising=False)
    assert chosen_dtype() == "auto"
    with extraction_dtype("float32"):
        assert chosen_dtype() == "float32"
        with extraction_dtype(None):  # no choice: the outer one stands
            assert chosen_dtype() == "float32"
        with extraction_dtype("bfloat16"):
            assert chosen_dtype() == "bfloat16"
    assert chosen_dtype() == "auto"
    monkeypatch.setenv(ENV, "bfloat16")
    assert chosen_dtype() == "bfloat16"
    with extraction_dtype("float32"):
        assert chosen_dtype() == "float32"
    import os

    assert os.environ[ENV] == "bfloat16"  # nothing of ours writes the variable
