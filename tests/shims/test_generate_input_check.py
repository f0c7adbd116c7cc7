"""generate_input_check: ids the verifier cannot embed refused up front, naming where they are."""

from __future__ import annotations

import pytest

from speculators_compat.shims.generate_input_check import SHIM, problems
from tests.helpers import run_python

pytestmark = pytest.mark.engine

# One generator: a good batch, a batch with an id past the vocabulary, one with an empty sequence
# (refused by token_attribution), the good batch again.
_RUN = """
import json, os
os.environ.setdefault("SPECULATORS_COMPAT_DTYPE", "float32")
import speculators_compat
from speculators_compat.cpu_alias import ensure_vllm_cpu_alias
ensure_vllm_cpu_alias()
import speculators.data_generation.vllm_hidden_states_generator as gen_module
from speculators_compat.tiny import build, sample_token_ids

path = build("llama-tiny")
gen = gen_module.VllmHiddenStatesGenerator(str(path), layer_ids=[1, 2, 3], max_model_len=512)
vocab = gen.vllm_config.model_config.get_vocab_size()
good = sample_token_ids(path, 2)
out = {"vocab": vocab}


def attempt(name, batch):
    try:
        results = gen.generate(batch)
        out[name] = {"ok": True, "states": [float(r["hidden_states"][0].abs().sum()) for r in results]}
    except BaseException as exc:
        out[name] = {"ok": False, "type": type(exc).__name__, "message": str(exc)[:2000]}


attempt("good", good)
attempt("past_vocab", [good[0], good[1][:5] + [vocab + 7] + good[1][6:]])
attempt("empty", [good[0], []])
attempt("good_again", good)
print(json.dumps(out), flush=True)
os._exit(0)
"""


def test_problems_names_sequence_position_and_id():
    assert problems([[1, 2], [3, 99, 4, -1], []], vocab_size=10) == [
        "sequence 1, position 1: id 99",
        "sequence 1, position 3: id -1",
    ]
    assert problems([[0, 9]], vocab_size=10) == []


def test_with_it_bad_ids_are_refused_before_vllm_runs_and_the_generator_still_works():
    result = run_python(_RUN)
    vocab = result["vocab"]
    assert result["good"]["ok"], result["good"]
    bad = result["past_vocab"]
    assert not bad["ok"] and bad["type"] == "ValueError", bad
    assert f"sequence 1, position 5: id {vocab + 7}" in bad["message"], bad["message"]
    assert f"ids 0 to {vocab - 1}" in bad["message"]
    empty = result["empty"]
    assert not empty["ok"] and empty["type"] == "ValueError", empty
    assert "sequences [1] are empty" in empty["message"], empty["message"]
    assert result["good_again"] == result["good"]  # nothing of the refused calls was scheduled


def test_without_it_an_id_past_the_vocabulary_is_not_refused_by_speculators():
    result = run_python(_RUN, env={"SPECULATORS_COMPAT_DISABLE": SHIM.name})
    bad = result["past_vocab"]
    # vLLM is handed the id: on one rank the worker fails in the embedding (IndexError, naming no
    # sequence; vLLM 0.11's IPEX embedding: "INDICES element is out of DATA bounds"), and the
    # generator does not recover
    out_of_range = ("index out of range", "INDICES element is out of DATA bounds")
    assert not bad["ok"] and any(text in bad["message"] for text in out_of_range), bad
    assert "sequence 1, position 5" not in bad["message"]
    assert not result["good_again"]["ok"], result["good_again"]
