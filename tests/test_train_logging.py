"""``train --log-to``: speculators 0.3.0's own metric loggers, wired by the pipeline. TensorBoard's
event files are read back against ``train_metrics.jsonl``; a resumed run continues the step
count (shim ``training_resume_step``); a logger whose package is missing is refused before any
stage runs. (Samples written by hand, no vLLM engine: seconds.)"""

from __future__ import annotations

import importlib.util
import json

import pytest

from speculators_compat.tiny import build
from tests.pipeline_helpers import cli, extracted_by_hand

pytestmark = pytest.mark.training


@pytest.fixture(scope="module")
def model():
    return build("deepseek-v3-tiny", "float32")


def _scalars(folder, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def _train_losses(run) -> list[tuple[int, float]]:
    lines = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    return [(r["step"], r["train"]["loss"]) for r in lines if "train" in r]


def test_tensorboard_holds_every_step_and_a_resumed_run_continues_the_count(tmp_path, model):
    pytest.importorskip("tensorboard", reason="the test extra installs tensorboard")
    run = extracted_by_hand(model, tmp_path / "r", 12)
    assert cli("vocab", "--out", run.root).returncode == 0
    args = ("--total-seq-len", 128, "--log-to", "tensorboard", "--quiet")
    first = cli("train", "--out", run.root, "--epochs", 1, *args)
    assert first.returncode == 0, first.stderr[-3000:]
    logged = run.logs / run.root.name
    per_epoch = len(_train_losses(run))
    assert per_epoch >= 2
    # resumed from epoch 0's checkpoint: a second epoch
    second = cli("train", "--out", run.root, "--epochs", 2, *args)
    assert second.returncode == 0, second.stderr[-3000:]

    written = _train_losses(run)
    assert [step for step, _ in written] == list(range(2 * per_epoch))  # continued, not from 0
    board = _scalars(logged, "train/loss")
    assert [step for step, _ in board] == [step for step, _ in written]
    assert [v for _, v in board] == pytest.approx([v for _, v in written], rel=1e-6)
    # validation (one record per epoch) and the learning rate went there too
    assert len(_scalars(logged, "val/loss_epoch")) == 2
    assert len(_scalars(logged, "lr")) == 2 * per_epoch


def test_a_logger_whose_package_is_missing_is_refused_before_any_stage(tmp_path, model):
    missing = next((n for n in ("wandb", "trackio") if importlib.util.find_spec(n) is None), None)
    if missing is None:
        pytest.skip("wandb and trackio are both installed here")
    run = extracted_by_hand(model, tmp_path / "r", 3)
    proc = cli("run", "--out", run.root, "--log-to", f"tensorboard,{missing}", "--quiet")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"--log-to {missing}: the {missing} package is not installed here" in proc.stderr
    assert f"pip install 'speculators-compat[{missing}]'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert run.done("vocab") is None and not run.checkpoints.exists()  # no stage ran

    unknown = cli("train", "--out", run.root, "--log-to", "tensorbord")
    assert unknown.returncode == 2 and "tensorbord: choose from tensorboard, wandb, trackio" in unknown.stderr
