"""The trained draft where it is used: vLLM's own EAGLE-3 speculative decoding (CPU builds run it
from vLLM 0.20; the matrix's serving env is 0.22).

One demo run (the trained tiny DeepSeek-V3 verifier, regenerated data, training, serve-check,
the aux-id ablation) per module, through the CLI as a user runs it; then the checks that keep a
wrongly configured draft from being served, and a violation of losslessness injected into vLLM.
On the trained verifier acceptance tells a right pipeline from a broken one (a random verifier's
greedy choices are near-ties that no draft can learn: position 0 reached 0.26-0.31 there).
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from speculators_compat.pipeline.layout import RunFolder
from speculators_compat.pipeline.serve import (
    cpu_spec_decode_unsupported,
    draft_with_aux_ids,
    latest_checkpoint,
    serve_check,
)
from tests.pipeline_helpers import DEMO_EPOCHS, assert_served_states_equal_training_states, cli, demo_run

pytestmark = pytest.mark.serving

#: What the served demo draft must reach: the issue's goals (vLLM's own bar for Llama-3.1-8B's
#: EAGLE-3 draft is 0.73 / 2.60). Measured on vLLM 0.22 (CPU, 30 held-out prompts): position 0
#: 0.879, mean accepted length 3.40 (acceptance 0.879/0.798/0.718 by position).
ACCEPTANCE_0, MEAN_ACCEPTED_LENGTH = 0.75, 2.3
#: vLLM's position-0 acceptance against speculators' own draft forward replayed on the same
#: windows: measured 0.879 against 0.886 (123 vs 124 drafts). Later positions: vLLM accepted
#: more than the replay predicts, 0.798/0.718 against 0.772/0.585 (docs/pipeline.md).
REPLAY_TOLERANCE = 0.03
#: Later positions: vLLM never accepts less than the replay predicts (beyond the pipeline's noise)
#: and not more than this above it (measured +0.026, +0.133).
LATER_POSITIONS_ABOVE_REPLAY = 0.2


@pytest.fixture(scope="module", autouse=True)
def _scalar_inductor_kernels():
    """vLLM 0.20+ on CPU compiles its random sampler with inductor at every engine start, and
    inductor first builds and loads a test program per vector ISA: about 25 s of a 40 s engine
    start on 2 cores, and these tests start a dozen engines. Scalar code for that kernel instead
    (greedy decoding, all these tests use, never runs it). Only here: it also changes how
    inductor lowers other graphs (e.g. the error draft_eager_on_cpu's test expects)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_VEC_ISA_OK", "0")
        yield


def _needs_spec_decode():
    reason = cpu_spec_decode_unsupported()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    _needs_spec_decode()
    run, stdout = demo_run(tmp_path_factory.mktemp("served") / "run")
    return run, json.loads(run.serve_report.read_text()), stdout


def test_demo_serves_its_draft_losslessly_and_reports_vllm_counters(served):
    run, report, stdout = served
    assert report["violations"] == [], report["violations"]
    assert report["identical"], report["ties"]  # float32, a confident verifier: not even a tie
    # served in the dtype the training states were extracted in (vLLM's "auto" would serve this
    # float32 checkpoint in bfloat16 on a CPU with AVX-512 BF16)
    assert report["dtype"] == "float32", report
    assert report["drafts"] > 0 and report["draft_tokens"] == 3 * report["drafts"]
    assert len(report["accepted_per_position"]) == 3
    assert sum(report["accepted_per_position"]) == report["accepted_tokens"]
    assert report["aux_layer_ids"] == [k + 1 for k in run.captured_layer_ids()[:-1]]
    for label in ("acceptance", "per position", "mean accepted length", "tokens/s", "lossless", "ablation"):
        assert label in stdout, label


def test_demo_draft_is_accepted(served):
    _, report, _ = served
    assert report["acceptance_per_position"][0] >= ACCEPTANCE_0, report
    assert report["mean_accepted_length"] >= MEAN_ACCEPTED_LENGTH, report


def test_vllm_accepts_what_the_training_code_predicts(served):
    """vLLM's counters against speculators' own draft forward on the extracted states, replayed
    as greedy speculative decoding over the same prompts: the served draft computes what it was
    trained to compute, position by position."""
    _, report, _ = served
    assert abs(report["drafts"] - report["expected_drafts"]) <= 0.1 * report["drafts"], report
    got, expected = report["acceptance_per_position"], report["expected_per_position"]
    assert abs(got[0] - expected[0]) <= REPLAY_TOLERANCE, report
    for later, replayed in zip(got[1:], expected[1:], strict=True):
        assert replayed - REPLAY_TOLERANCE <= later <= replayed + LATER_POSITIONS_ABOVE_REPLAY, report


def test_regenerated_answers_are_the_verifier_own_greedy_tokens(served):
    """The transformers oracle, at every answer position of the training data, picks the token
    the data holds: the samples say what the verifier says."""
    from speculators_compat.oracle.reference import ReferenceModel

    run, _, _ = served
    reference = ReferenceModel(run.spec().model)
    agree = total = 0
    for i in range(10):
        data = torch.load(run.hidden_states / f"data_{i}.pt", weights_only=True)
        ids, mask = data["input_ids"], data["loss_mask"].bool()
        with torch.no_grad():
            greedy = reference.model(input_ids=ids[None], use_cache=False).logits[0].argmax(-1)
        hits = (greedy[:-1] == ids[1:])[mask[1:]]
        agree, total = agree + int(hits.sum()), total + hits.numel()
    assert total > 100
    assert agree / total >= 0.95, agree / total


def test_a_draft_with_aux_ids_shifted_back_by_one_is_served_losslessly(served, tmp_path):
    """The same weights served with the captured layer ids taken as vLLM's (one layer early, the
    bug that took MiniMax-M2.5's draft from ~45% to ~10%, vLLM #43671): serve-check runs it
    without refusing (check_layer_ids=False) and the outputs stay the verifier's.

    On this 6-layer verifier the fault costs little: measured position 0 0.850 against 0.879
    (127 and 124 drafts; the issue's goal was a drop of 0.25). Adjacent layers' states differ by
    10-30% here (what assert_served_states_equal_training_states checks) and the task's answers
    are easy to predict from any of them; docs/pipeline.md says so. What holds: the wrong ids
    never do better than the right ones beyond the noise, and the demo prints the drop."""
    run, report, stdout = served
    draft = draft_with_aux_ids(latest_checkpoint(run), tmp_path / "draft", run.captured_layer_ids()[:-1])
    shifted = serve_check(run, draft=draft, check_layer_ids=False)
    assert shifted.lossless
    assert shifted.aux_layer_ids == [k - 1 for k in report["aux_layer_ids"]]
    # The training code's replay reads the extracted states, not the config: it does not move.
    assert shifted.expected_per_position == report["expected_per_position"]
    assert shifted.prompts == report["prompts"]
    right, wrong = report["acceptance_per_position"][0], shifted.acceptance_per_position[0]
    error = math.hypot(
        math.sqrt(right * (1 - right) / report["drafts"]), math.sqrt(wrong * (1 - wrong) / shifted.drafts)
    )
    assert wrong <= right + 3 * error, (right, wrong, error)
    assert "a drop of" in stdout  # the demo's own ablation line


def test_serve_check_names_a_violation_injected_into_vllms_rejection_sampler(served, monkeypatch):
    """vLLM's rejection sampler made to accept every draft token (tests/inject/accept_all, put on
    the serving engines' PYTHONPATH): outputs with the draft are no longer the verifier's, and
    serve-check fails naming prompt, token, the verifier's margin and the tolerance, none of them
    a tie."""
    run, _, _ = served
    inject = str(os.path.join(os.path.dirname(__file__), "inject", "accept_all"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [inject, os.environ.get("PYTHONPATH")])))
    report = serve_check(run, prompts=16)
    assert report.acceptance_rate == 1.0  # every draft token kept
    assert not report.lossless and report.violations, report.lines()
    for v in report.violations:
        assert v["margin"] is None or v["margin"] > v["tolerance"]
    text = "\n".join(report.lines())
    assert "NO: " in text and "VIOLATION" in text
    first = report.violations[0]
    assert f"prompt {first['prompt']}, token {first['position']}: verifier margin" in text


def test_without_the_rotary_shim_vllm_serving_breaks_and_serve_check_says_so(served, monkeypatch):
    """vLLM's CPU rotary embedding on DeepSeek's 3-D query (cpu_rotary_embedding_3d off in the
    serving engines, as a user's plain vLLM runs): the verifier computes different logits for
    the batched verification than for its one-token decode, so greedy outputs with the draft
    differ where the verifier was far from tied: a real violation, named. Measured on the demo's
    run (30 prompts): 13 differ, margins up to 10 logits, acceptance 0.500/0.236/0.116 against
    0.879/0.798/0.718 with the shim, which makes the outputs identical."""
    run, report, _ = served
    monkeypatch.setenv("SPECULATORS_COMPAT_DISABLE", "cpu_rotary_embedding_3d")
    broken = serve_check(run, prompts=16)
    assert "cpu_rotary_embedding_3d" not in broken.serving_shims
    assert not broken.lossless and broken.violations, broken.lines()
    assert max(v["margin"] or 0 for v in broken.violations) > 1.0  # not a near-tie
    assert broken.acceptance_per_position[0] < report["acceptance_per_position"][0] - 0.2, broken.lines()


def test_served_draft_is_fed_the_states_it_was_trained_on(served):
    run, _, _ = served
    assert_served_states_equal_training_states(run)


def test_serve_check_refuses_a_draft_with_other_layer_ids(served, tmp_path):
    """Before any engine starts: a draft without the field (vLLM would pick its own default
    layers, or crash), with null, or with ids one layer early."""
    from speculators_compat.pipeline.errors import PipelineError

    run, _, _ = served
    for i, value in enumerate(["missing", None, run.captured_layer_ids()[:-1]]):
        draft = draft_with_aux_ids(latest_checkpoint(run), tmp_path / f"draft{i}", value)
        with pytest.raises(PipelineError, match="state entering layer k"):
            serve_check(run, draft=draft)
    proc = cli("serve-check", "--out", run.root, "--draft", draft)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "eagle_aux_hidden_state_layer_ids" in proc.stderr


@pytest.fixture(scope="module")
def served_kimi(tmp_path_factory):
    """The same pipeline on the trained tiny Kimi-K2.5 wrapper (vLLM's
    KimiK25ForConditionalGeneration takes EAGLE-3 aux layers through its language model),
    smaller: run, then serve-check."""
    _needs_spec_decode()
    from speculators_compat.tiny import build, tasks_dataset_path
    from tests.helpers import unsupported_reason

    reason = unsupported_reason("KimiK25ForConditionalGeneration")
    if reason:
        pytest.skip(reason)
    model = build("kimi-k25-tiny-trained", "float32")
    out = tmp_path_factory.mktemp("served-kimi") / "run"
    args = ["--model", model, "--data", tasks_dataset_path(), "--out", out, "--max-samples", KIMI_SAMPLES]
    args += ["--regenerate", 64, "--seq-length", 256, "--dtype", "float32", "--batch-size", 32]
    args += ["--draft-vocab-size", 256, "--epochs", DEMO_EPOCHS, "--lr", "1e-3", "--total-seq-len", 1024]
    proc = cli("run", *args, "--quiet", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    check = cli("serve-check", "--out", out, timeout=1800)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-5000:]
    run = RunFolder(out)
    return run, json.loads(run.serve_report.read_text())


#: Conversations of the Kimi-K2.5 run (one regenerated sample per assistant turn).
KIMI_SAMPLES = 150
#: Position-0 acceptance of the Kimi-K2.5 run. Measured on vLLM 0.22 (CPU): 0.743 (replay 0.753),
#: 74 drafts over 15 held-out prompts, after 20 epochs on 135 conversations' answers.
KIMI_ACCEPTANCE_0 = 0.6


def test_kimi_k25_draft_is_fed_its_training_states_and_served_losslessly(served_kimi):
    run, report = served_kimi
    assert_served_states_equal_training_states(run)
    assert report["violations"] == [], report["violations"]
    assert report["drafts"] > 0
    assert abs(report["drafts"] - report["expected_drafts"]) <= 0.1 * report["drafts"], report
    got, expected = report["acceptance_per_position"], report["expected_per_position"]
    assert abs(got[0] - expected[0]) <= REPLAY_TOLERANCE, report
    assert got[0] >= KIMI_ACCEPTANCE_0, report


def test_a_llama_folder_runs_regenerated_and_serves(tmp_path):
    """Any verifier folder (issue 28, part 5): `run --regenerate` then `serve-check` on a Llama
    checkpoint, as on the DeepSeek-V3 and Kimi-K2.5 fixtures above. The random llama-tiny's
    answers are near-ties no draft learns (acceptance is not the point, and 1 epoch is enough to
    serve); what holds on any verifier: vLLM feeds the draft its training states and serving
    with it is lossless."""
    _needs_spec_decode()
    from speculators_compat.tiny import build, tasks_dataset_path

    model = build("llama-tiny", "float32")
    out = tmp_path / "run"
    args = ["--model", model, "--data", tasks_dataset_path(), "--out", out, "--max-samples", 40]
    args += ["--regenerate", 32, "--seq-length", 256, "--dtype", "float32", "--batch-size", 32]
    args += ["--draft-vocab-size", 256, "--epochs", 1, "--lr", "1e-3", "--total-seq-len", 1024]
    proc = cli("run", *args, "--quiet", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    check = cli("serve-check", "--out", out, timeout=1800)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-5000:]
    run = RunFolder(out)
    report = json.loads(run.serve_report.read_text())
    assert report["violations"] == [] and report["drafts"] > 0, report
    assert_served_states_equal_training_states(run)
