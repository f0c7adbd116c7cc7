"""``extract --shard I/N``: shards running at once on one run folder (real vLLM engines on CPU),
each sample extracted once, each shard resumable on its own, an incomplete set refused."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from speculators_compat.oracle.reference import TOLERANCE
from speculators_compat.pipeline.check import check_against_reference
from speculators_compat.pipeline.layout import RunFolder
from speculators_compat.pipeline.spec import Shard
from tests.pipeline_helpers import ROOT, cli, prepare

TOTAL = 16


@pytest.mark.cli_input
@given(count=st.integers(1, 64), samples=st.integers(0, 300))
def test_shards_split_the_samples_exactly(count, samples):
    owners = [[i for i in range(samples) if Shard(index, count).owns(i)] for index in range(count)]
    assert sorted(i for own in owners for i in own) == list(range(samples))
    assert max(map(len, owners)) - min(map(len, owners)) <= 1


@pytest.mark.cli_input
@pytest.mark.parametrize("bad", ["2/2", "1", "-1/2", "a/b", "0/0", "1/2/3"])
def test_a_bad_shard_is_refused_before_anything_runs(tmp_path, bad):
    proc = cli("extract", "--out", tmp_path / "run", "--shard", bad)
    assert proc.returncode == 2, proc.stderr
    assert "Invalid value for '--shard'" in proc.stderr and "I/N" in proc.stderr
    assert not (tmp_path / "run").exists()


def _extract(out, shard: str | None, core: int | None):
    """``extract`` of ``out`` (one shard) in a process of its own, on one core if given."""
    env = dict(os.environ)
    if core is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
    args = ["--shard", shard] if shard else []
    return subprocess.Popen(
        [sys.executable, "-m", "speculators_compat", "extract", "--out", str(out), "--batch-size", "4"]
        + ["--dtype", "float32", "--quiet", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """prepare, then shards 0/2 and 1/2 started together (one core each where there are two)."""
    from speculators_compat.tiny import build

    out = tmp_path_factory.mktemp("shards") / "run"
    prep = prepare(build("deepseek-v3-tiny", "float32"), out, "--max-samples", TOTAL, "--seq-length", 512)
    assert prep.returncode == 0, prep.stderr[-3000:]
    two = (os.cpu_count() or 1) >= 2
    procs = [_extract(out, f"{i}/2", i if two else None) for i in range(2)]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=900)
        results.append((proc.returncode, stdout, stderr))
    return RunFolder(out), results


def test_two_shards_at_once_extract_every_sample_once(sharded):
    run, results = sharded
    for rc, stdout, stderr in results:
        assert rc == 0, stdout[-2000:] + stderr[-4000:]
        assert "Traceback" not in stderr
    for i, (_, stdout, _) in enumerate(results):
        assert f"shard={i}/2" in stdout and f"extracted_now={TOTAL // 2}" in stdout, stdout
    record = json.loads((run.hidden_states / "extraction.json").read_text())
    shards = record["shards"]
    assert set(shards) == {"0/2", "1/2"} and record["dtype"] == "float32"
    assert [shards[f"{i}/2"]["extracted"] for i in range(2)] == [TOTAL // 2, TOTAL // 2]
    # they ran at the same time: each started before the other finished
    assert shards["0/2"]["started_at"] <= shards["1/2"]["finished_at"]
    assert shards["1/2"]["started_at"] <= shards["0/2"]["finished_at"]
    # one of them found the set complete and completed the stage
    assert sum("missing=0" in stdout for _, stdout, _ in results) >= 1
    assert run.done("extract")["samples"] == TOTAL and run.done("prepare")["samples"] == TOTAL
    config = json.loads((run.hidden_states / "data_config.json").read_text())
    assert config["data"]["num_samples"] == TOTAL
    assert not [p for p in run.root.rglob("*.partial")]

    import datasets

    prepared = datasets.load_from_disk(str(run.prepared))
    assert sorted(int(p.stem[5:]) for p in run.hidden_states.glob("data_*.pt")) == list(range(TOTAL))
    for i in range(TOTAL):  # every file holds its own sample
        sample = torch.load(run.hidden_states / f"data_{i}.pt", weights_only=True)
        assert sample["input_ids"].tolist() == prepared[i]["input_ids"].tolist()
    assert check_against_reference(run, samples=4) <= TOLERANCE["float32"]


def _refused(proc, *needles):
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    for needle in needles:
        assert needle in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def _shard_0_running_here(run, running: bool) -> None:
    """extraction.json says shard 0/2 runs on this machine as this (live) pytest process, or
    that it finished."""
    path = run.hidden_states / "extraction.json"
    record = json.loads(path.read_text())
    entry = record["shards"]["0/2"]
    entry.update(host=socket.gethostname(), pid=os.getpid(), finished_at=None if running else "now")
    path.write_text(json.dumps(record))


def test_an_incomplete_set_is_refused_and_a_shard_resumes_alone(sharded, tmp_path):
    source, _ = sharded
    shutil.copytree(source.root, tmp_path / "run")
    run = RunFolder(tmp_path / "run")
    for i in (3, 4):  # one sample of each shard lost (e.g. a shard killed before writing them)
        (run.hidden_states / f"data_{i}.pt").unlink()
    for stage in ("vocab", "train"):
        _refused(
            cli(stage, "--out", run.root),
            f"{stage} needs every sample's hidden states; 2 of {TOTAL} are not in",
            "samples 3-4",
            "shard 0/2: finished at",
            "shard 1/2: finished at",
        )
    assert not run.vocab.exists()

    # Shard 0/2 is running here again, writing sample 4; a dead shard 1/2 left sample 3's file.
    _shard_0_running_here(run, True)
    theirs = run.hidden_states / f"data_4.pt.{socket.gethostname()}.{os.getpid()}.partial"
    stale = run.hidden_states / "data_3.pt.other-host.4243.partial"
    theirs.write_bytes(b"x")
    stale.write_bytes(b"x")
    again = _extract(run.root, "1/2", None)  # the other shard of the same split: it may run
    stdout, stderr = again.communicate(timeout=900)
    assert again.returncode == 0, stderr[-4000:]
    assert "extracted_now=1" in stdout and "missing=1" in stdout, stdout
    assert "shard 1/2 is complete" in stdout
    assert (run.hidden_states / "data_3.pt").is_file() and not (run.hidden_states / "data_4.pt").exists()
    assert theirs.exists() and not stale.exists()  # only its own leftovers are cleaned up
    assert run.done("extract") is None
    _refused(
        cli("vocab", "--out", run.root),
        f"1 of {TOTAL} are not in",
        "samples 4;",
        f"shard 0/2: started on {socket.gethostname()} (pid {os.getpid()})",
    )
    # an extraction of every sample overlaps the running shard: refused before vLLM starts
    _refused(
        cli("extract", "--out", run.root, "--dtype", "float32"),
        f"an extraction --shard 0/2 of this run is running on this machine (pid {os.getpid()}",
    )
    assert theirs.exists()

    _shard_0_running_here(run, False)  # it stopped without writing sample 4
    whole = _extract(run.root, None, None)
    stdout, stderr = whole.communicate(timeout=900)
    assert whole.returncode == 0, stderr[-4000:]
    assert "extracted_now=1" in stdout and not theirs.exists()
    assert run.done("extract")["samples"] == TOTAL
    assert cli("vocab", "--out", run.root, "--draft-vocab-size", 256).returncode == 0
    assert check_against_reference(run, samples=5) <= TOLERANCE["float32"]
