"""Running the CLI in a fresh process, as a user does."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch

from tests.helpers import ROOT, fresh


def cli(
    *args, env: dict[str, str | None] | None = None, timeout: float = 900, fork: bool = True
) -> subprocess.CompletedProcess:
    """``speculators-compat ARGS`` in a fresh process; ``env`` adds to this one's environment (a
    value of None removes the variable). ``fork=False``: a new interpreter, not a child of the
    fork server (which has started already: a ``PYTHONPATH`` with a sitecustomize needs this)."""
    return fresh(
        ["-m", "speculators_compat", *map(str, args)],
        env={k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None},
        timeout=timeout,
        cwd=ROOT,
        fork=fork,
    )


#: Conversations and epochs of the served demo run (the demo's own defaults: 300, 20).
DEMO_SAMPLES, DEMO_EPOCHS = 300, 20


def demo_run(out: Path, *args):
    """``speculators-compat demo`` (trained verifier, its defaults) into ``out``, through the CLI
    as a user runs it; returns the run folder and the demo's output."""
    from speculators_compat.pipeline.layout import RunFolder

    args = ("--samples", DEMO_SAMPLES, "--epochs", DEMO_EPOCHS, "--quiet", *args)
    proc = cli("demo", "--out", out, *args, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return RunFolder(out), proc.stdout


def prepare(model, out, *args, data=None) -> subprocess.CompletedProcess:
    """``speculators-compat prepare`` of ``model`` on the embedded chat data (or ``data``)."""
    from speculators_compat.tiny import chat_dataset_path

    return cli("prepare", "--model", model, "--data", data or chat_dataset_path(), "--out", out, *args)


def assert_served_states_equal_training_states(run) -> None:
    """The saved draft names vLLM's aux layer ids (the state *entering* layer k), derived from the
    captured layer ids; for every sequence and layer, the state vLLM feeds for those ids (the
    transformers oracle's output_hidden_states[k], the same convention) equals the training data.
    Read one layer early (the captured ids taken as vLLM ids), the states differ by more than ten
    times the bound. (On the trained verifier the closest such pair measured 0.027; random
    weights' adjacent layers differ by 0.1-0.3.)"""
    from speculators_compat.oracle.reference import ReferenceModel, relative_error, tolerance
    from speculators_compat.pipeline.serve import latest_checkpoint
    from speculators_compat.tiny import sharp_attention

    captured = run.captured_layer_ids()
    config = json.loads((latest_checkpoint(run) / "config.json").read_text())
    aux = config["eagle_aux_hidden_state_layer_ids"]
    assert aux == [k + 1 for k in captured[:-1]], (aux, captured)
    model = Path(run.spec().model)
    recipe = model / "recipe.json"  # a fixture's (a user's model has none: the general bound)
    bound = tolerance("float32", sharp=recipe.is_file() and sharp_attention(json.loads(recipe.read_text())))
    reference = ReferenceModel(model)
    worst, shifted_best = 0.0, float("inf")
    for path in sorted(run.hidden_states.glob("data_*.pt")):
        data = torch.load(path, weights_only=True)
        entering = reference.entering_states(data["input_ids"].tolist())
        for j, layer in enumerate(aux):
            state = data["hidden_states"][j].float()
            worst = max(worst, relative_error(state, entering[layer]))
            shifted_best = min(shifted_best, relative_error(state, entering[layer - 1]))
    assert worst <= bound, worst
    assert shifted_best > 10 * bound, shifted_best


def extracted_by_hand(model, out, samples: int):
    """A prepared run whose sample files are written as extraction writes them (random states of
    the right shapes, their sizes recorded, ``data_config.json``), without vLLM: what vocab, train
    and verify read."""
    import datasets

    from speculators_compat.pipeline.extract import write_data_config
    from speculators_compat.pipeline.layout import RunFolder
    from speculators_compat.pipeline.model_info import inspect_model
    from speculators_compat.pipeline.samples import write_batch
    from speculators_compat.pipeline.shards import record_sizes

    proc = prepare(model, out, "--max-samples", samples, "--seq-length", 64)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = RunFolder(out)
    rows = list(datasets.load_from_disk(str(run.prepared)).with_format(None))
    info = inspect_model(model)
    layer_ids = info.default_layer_ids()
    results = [
        {
            "input_ids": row["input_ids"],
            "hidden_states": [torch.randn(len(row["input_ids"]), info.hidden_size) for _ in layer_ids],
        }
        for row in rows
    ]
    run.hidden_states.mkdir()
    write_batch(run.hidden_states, list(range(len(rows))), rows, results, lambda s: record_sizes(run, s))
    write_data_config(run, run.spec(), info, layer_ids, len(rows), 1, "float32")
    run.mark_done("extract", samples=len(rows))
    return run
