"""Fidelity ablations: faults that have cost real users, injected into the pipeline, each served
in vLLM's own EAGLE-3 speculative decoding beside the right draft (issue 28, part 3).

The right run is the demo's (the trained tiny DeepSeek-V3 verifier, its own answers, 20 epochs);
each faulted run copies the stages before the fault from it, and runs the rest through the CLI as
a user would, with the fault injected the way it reaches users (a shim off, a flag left out,
another run's file). The aux-id shift (a) is served from the demo's own run in test_serving.py.
The issue's goal was a drop of 0.25 in position-0 acceptance for each; on this verifier only the
foreign vocabulary shows (over every drafted token), and states misattributed by chunked prefill
now stop extraction before anything trains on them. Each test says what was measured and why;
docs/pipeline.md ("Fidelity ablations") has the table.

Not in CI's serving tier (each faulted run trains a draft again: 32.9 minutes on 2 cores beside
a CI run, about 15 alone, with the demo's run); they run with the whole suite on vLLM 0.22
(``tox -e vllm0.22``) and alone with ``tox -e ablations``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch

from speculators_compat.cli.pipeline import demo_request
from speculators_compat.pipeline.layout import STAGES, RunFolder
from speculators_compat.pipeline.serve import cpu_spec_decode_unsupported
from tests.pipeline_helpers import cli, demo_run

pytestmark = [pytest.mark.serving, pytest.mark.ablation]


def _train_flags() -> list[str]:
    """The demo's training options as ``train``/``run`` flags."""
    t = demo_request("trained").options.train
    return ["--epochs", t.epochs, "--lr", t.lr, "--total-seq-len", t.total_seq_len, "--quiet"]


def _extract_flags() -> list[str]:
    s = demo_request("trained")
    return ["--batch-size", s.options.batch_size, "--dtype", s.dtype]


def copy_run(base: RunFolder, dest: Path, keep: tuple[str, ...]) -> RunFolder:
    """A new run folder holding ``base``'s settings and the outputs of its stages in ``keep``
    (the first stages, in order); later stages are not complete there."""
    assert keep == STAGES[: len(keep)], keep
    outputs = {
        "prepare": (base.prepared, base.regenerated, base.token_freq),
        "extract": (base.hidden_states,),
        "vocab": (base.vocab,),
    }
    dest.mkdir(parents=True)
    for stage in keep:
        for path in outputs[stage]:
            if path.is_dir():
                shutil.copytree(path, dest / path.name)
            elif path.is_file():
                shutil.copy2(path, dest / path.name)
    state = base.read()
    state["stages"] = {k: v for k, v in state["stages"].items() if k in keep}
    (dest / "run.json").write_text(json.dumps(state, indent=2))
    return RunFolder(dest)


def _run(run: RunFolder, *args, env: dict | None = None) -> None:
    proc = cli("run", "--out", run.root, *args, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def final_norm_off(base: RunFolder, dest: Path) -> RunFolder:
    """(b) Training targets lm_head(last layer) without the verifier's final norm (speculators
    #313): the same states, trained with the ``training_target_final_norm`` shim off."""
    run = copy_run(base, dest, ("prepare", "extract", "vocab"))
    _run(run, *_train_flags(), env={"SPECULATORS_COMPAT_DISABLE": "training_target_final_norm"})
    return run


def attribution_off_extract(run: RunFolder):
    """(c) States misattributed between the sequences of one batch (speculators #279): extract,
    64 sequences a call, with the ``token_attribution`` shim off. vLLM schedules 32 a step; the
    fault needs a step that cannot prefill them whole, which the demo's 30-token samples never
    fill at speculators' 8,192-token budget: tests/inject/small_token_budget lowers it to 512
    (Kimi-K2.5's 2,000-8,000-token conversations fill 8,192). Returns the finished process."""
    flags = _extract_flags()
    flags[flags.index("--batch-size") + 1] = 64
    inject = str(Path(__file__).parent / "inject" / "small_token_budget")
    path = os.pathsep.join(filter(None, [inject, os.environ.get("PYTHONPATH")]))
    env = {"SPECULATORS_COMPAT_DISABLE": "token_attribution", "PYTHONPATH": path}
    # A new interpreter: the injection's sitecustomize runs at start-up.
    return cli("extract", "--out", run.root, *flags, "--quiet", env=env, timeout=900, fork=False)


def dataset_answers(base: RunFolder, dest: Path) -> RunFolder:
    """(d) The chat data's own answers instead of the verifier's (``--regenerate`` left out)."""
    s = base.spec()
    run = RunFolder(dest)
    _run(
        run,
        *("--model", s.model, "--data", s.data, "--seq-length", s.seq_length),
        *("--max-samples", s.max_samples, "--draft-vocab-size", s.draft_vocab_size),
        *_extract_flags(),
        *_train_flags(),
    )
    return run


def other_vocab(base: RunFolder, dest: Path) -> RunFolder:
    """(e) A draft vocabulary built from another run's token frequencies: the same verifier's
    tokenizer on the embedded general chat data (prepared without regeneration)."""
    from speculators_compat.tiny import chat_dataset_path

    other = RunFolder(dest.parent / f"{dest.name}-other")
    s = base.spec()
    proc = cli(
        *("prepare", "--model", s.model, "--data", chat_dataset_path(), "--out", other.root),
        *("--seq-length", s.seq_length, "--max-samples", s.max_samples, "--quiet"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = copy_run(base, dest, ("prepare", "extract"))
    shutil.copy2(other.token_freq, run.token_freq)
    _run(run, *_train_flags())
    return run


def served(run: RunFolder) -> dict:
    """serve-check on ``run`` through the CLI; its report."""
    proc = cli("serve-check", "--out", run.root, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(run.serve_report.read_text())
    assert report["violations"] == [], report["violations"]  # a bad draft is slow, never wrong
    return report


def drop(right: dict, wrong: dict, per: str) -> tuple[float, float]:
    """(drop, its standard error) in position-0 acceptance (``per="draft"``: over drafts) or in
    the acceptance rate over every drafted token (``per="token"``), of two binomial estimates."""
    if per == "draft":
        (p, n), (q, m) = ((r["acceptance_per_position"][0], r["drafts"]) for r in (right, wrong))
    else:
        (p, n), (q, m) = ((r["acceptance_rate"], r["draft_tokens"]) for r in (right, wrong))
    return p - q, math.hypot(math.sqrt(p * (1 - p) / n), math.sqrt(q * (1 - q) / m))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    reason = cpu_spec_decode_unsupported()
    if reason:
        pytest.skip(reason)
    run, _ = demo_run(tmp_path_factory.mktemp("demo") / "run")
    return run, json.loads(run.serve_report.read_text())


def test_a_vocabulary_from_another_run_costs_acceptance(base, tmp_path):
    """(e) Measured (vLLM 0.22, CPU): the other vocabulary holds 80.9% of the answers' tokens;
    acceptance 0.798 -> 0.637 over every drafted token (5.2 standard errors), per position
    0.879/0.798/0.718 -> 0.816/0.585/0.510: the fault shows, most at the later positions,
    less than the issue's 0.25 at position 0 (0.063)."""
    run, right = base
    wrong = served(other_vocab(run, tmp_path / "faulted"))
    lost, error = drop(right, wrong, "token")
    print(f"other vocabulary: {right['acceptance_rate']:.3f} -> {wrong['acceptance_rate']:.3f}, {error=:.3f}")
    assert lost >= 0.1 and lost >= 4 * error, (right["acceptance_rate"], wrong["acceptance_rate"], error)


@pytest.mark.parametrize("fault", [final_norm_off, dataset_answers], ids=lambda f: f.__name__)
def test_faults_this_verifier_cannot_show_never_raise_acceptance(base, tmp_path, fault):
    """(b) and (d) do not show here (docs/pipeline.md has why, with numbers; the reason of (b)
    is asserted below): measured at position 0 0.879 -> 0.860 (b) and 0.870 (d), over every
    drafted token 0.798 -> 0.773 and 0.715. What holds: the faulted draft never does better
    beyond the noise, and it is still served losslessly."""
    run, right = base
    wrong = served(fault(run, tmp_path / "faulted"))
    for per in ("draft", "token"):
        lost, error = drop(right, wrong, per)
        assert lost >= -3 * error, (fault.__name__, per, lost, error)


def test_targets_without_the_final_norm_keep_the_verifiers_argmax_here(base):
    """Why (b) cannot show on this verifier: its final norm's weight is nearly uniform (1.14 +-
    0.11), so lm_head(last layer) and lm_head(norm(last layer)), the targets without and with the
    shim, rank the same token first at 99.0% of answer positions, while the distributions differ
    (KL median 0.40 nats). Greedy acceptance reads only the first choice."""
    from safetensors.torch import load_file

    run, _ = base
    model = Path(run.spec().model)
    weights = load_file(str(model / "model.safetensors"))
    eps = json.loads((model / "config.json").read_text())["rms_norm_eps"]
    head, norm = weights["lm_head.weight"].float(), weights["model.norm.weight"].float()
    agree = total = 0
    for path in sorted(run.hidden_states.glob("data_*.pt")):
        data = torch.load(path, weights_only=True)
        last, mask = data["hidden_states"][-1].float(), data["loss_mask"].bool()
        raw = (last @ head.T).argmax(-1)
        real = (torch.nn.functional.rms_norm(last, (last.shape[-1],), norm, eps) @ head.T).argmax(-1)
        agree, total = agree + int((raw == real)[mask].sum()), total + int(mask.sum())
    assert total > 1000 and agree / total >= 0.98, agree / total


def test_states_misattributed_between_sequences_stop_extraction(base, tmp_path):
    """(c) With the token_attribution shim off and prefill in chunks, speculators 0.3.0 handed
    208 of 300 samples other sequences' states and 13 came back short. Measured before extract
    checked coverage (the run trained on them): vLLM accepted 0.752/0.503/0.404 by position
    (0.879/0.798/0.718 right; over every drafted token 0.553 against 0.798, 8 standard errors)
    while the training code's replay on those states predicted 0.252 at position 0: acceptance
    and the replay check both catch it. Now extraction stops at the first batch whose states do
    not cover their tokens, names the samples, keeps what was written before that batch and
    writes nothing of it."""
    run, _ = base
    faulted = copy_run(run, tmp_path / "faulted", ("prepare",))
    proc = attribution_off_extract(faulted)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "do not cover their own tokens" in proc.stderr and "token_attribution" in proc.stderr
    kept = sorted(faulted.hidden_states.glob("data_*.pt"))
    assert f"the {len(kept)} samples already on disk are kept" in proc.stderr
    assert faulted.done("extract") is None
