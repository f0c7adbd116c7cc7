"""tokenizer_remote_code: speculators' tokenizer load on a remote-code tokenizer (Kimi-K2.5)."""

from __future__ import annotations

import pytest

from speculators_compat.shims._targets import GENERATOR, module
from speculators_compat.shims.tokenizer_remote_code import SHIM
from speculators_compat.versions import installed_versions


def test_unpatched_load_fails_with_the_symptom_and_patched_loads(built, state):
    assert state(SHIM) == "applied"
    path = str(built("kimi-k25-tiny"))
    auto = module(GENERATOR).AutoTokenizer
    tokenizer = auto.from_pretrained(path)
    if installed_versions().transformers.major >= 5:
        # transformers 5 loads the tokenizer.json itself (a TokenizersBackend, remote code or
        # not): no error, and the same ids as the remote-code tokenizer gives.
        unpatched = auto.__wrapped__.from_pretrained(path)
        assert unpatched("hello world").input_ids == tokenizer("hello world").input_ids
        return
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        auto.__wrapped__.from_pretrained(path)
    assert type(tokenizer).__name__ == "KimiTinyTokenizer"
    # a built-in tokenizer loads as before
    assert type(auto.from_pretrained(str(built("llama-tiny")))).__name__ == "PreTrainedTokenizerFast"
