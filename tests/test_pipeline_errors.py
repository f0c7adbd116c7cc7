"""Bad input: a clear error that says what to do (exit 2), and nothing already written lost."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys

import pytest

from speculators_compat.tiny import build, chat_dataset_path
from tests.pipeline_helpers import ROOT, cli, extracted_by_hand, prepare

# The CLI's handling of bad input starts no vLLM engine: tox runs it once per torch release.
pytestmark = pytest.mark.cli_input


@pytest.fixture(scope="module")
def model():
    return build("deepseek-v3-tiny", "float32")


def _small_run(model, out, samples: int, *args):
    """prepare ``samples`` embedded conversations of at most 64 tokens into ``out``."""
    return prepare(model, out, "--max-samples", samples, "--seq-length", 64, *args)


def _fails(proc, *needles):
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    for needle in needles:
        assert needle in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_missing_model_path(tmp_path):
    proc = prepare(tmp_path / "nope", tmp_path / "r")
    _fails(proc, "does not exist", "huggingface-cli download")


def test_unreadable_config(tmp_path, model):
    broken = tmp_path / "m"
    shutil.copytree(model, broken)
    (broken / "config.json").write_text("{not json")
    proc = prepare(broken, tmp_path / "r")
    _fails(proc, "cannot read", "config.json")


def test_config_without_layer_counts(tmp_path, model):
    broken = tmp_path / "m"
    shutil.copytree(model, broken)
    config = json.loads((broken / "config.json").read_text())
    del config["num_hidden_layers"]
    (broken / "config.json").write_text(json.dumps(config))
    proc = prepare(broken, tmp_path / "r")
    _fails(proc, "num_hidden_layers", "how many decoder layers")


def test_empty_dataset(tmp_path, model):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = prepare(model, tmp_path / "r", data=empty)
    _fails(proc, "empty.jsonl")


def test_dataset_without_assistant_turns(tmp_path, model):
    data = tmp_path / "users.jsonl"
    rows = [{"conversations": [{"from": "human", "value": f"question {i}"}]} for i in range(5)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    proc = prepare(model, tmp_path / "r", data=data)
    _fails(proc, "assistant turn")


def test_long_sequences_are_truncated_counted_and_reported(tmp_path, model):
    out = tmp_path / "r"
    proc = _small_run(model, out, 30)
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads((out / "run.json").read_text())["stages"]["prepare"]
    assert facts["truncated"] > 0
    assert f"truncated={facts['truncated']}" in proc.stdout
    assert "were truncated" in proc.stderr
    import datasets

    assert max(len(r["input_ids"]) for r in datasets.load_from_disk(str(out / "prepared"))) == 64


def test_layer_ids_out_of_range_before_any_engine(tmp_path, model):
    out = tmp_path / "r"
    assert _small_run(model, out, 5).returncode == 0
    proc = cli("extract", "--out", out, "--layer-ids", "1,2,3,9")
    _fails(proc, "out of range", "0..5")
    assert not list((out / "hidden_states").glob("data_*.pt"))
    # and a run folder keeps what it has: prepare's output is still there
    assert (out / "prepared").is_dir()


def test_a_seq_length_the_model_cannot_take_is_refused_before_any_stage(tmp_path):
    """vLLM's own limit (its ModelConfig), checked before prepare runs: not a pydantic
    ValidationError from inside the generator after the data was prepared."""
    model = tmp_path / "short-model"
    shutil.copytree(build("llama-tiny", "float32"), model)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 256
    (model / "config.json").write_text(json.dumps(config))
    out = tmp_path / "r"
    proc = cli("run", "--model", model, "--data", chat_dataset_path(), "--out", out, "--seq-length", 512)
    _fails(proc, "--seq-length 512 is longer than", "Pass --seq-length 256 or less")
    assert not (out / "prepared").exists()
    # within the limit, the same model prepares
    assert prepare(model, out, "--seq-length", 256, "--max-samples", 3).returncode == 0


def test_a_folder_with_another_run_is_refused_then_resumed_or_overwritten(tmp_path, model):
    out = tmp_path / "r"
    first = _small_run(model, out, 5)
    assert first.returncode == 0
    before = (out / "token_freq.pt").read_bytes()
    other = _small_run(model, out, 7)
    _fails(other, "different run", "max_samples", "--resume", "--overwrite")
    assert (out / "token_freq.pt").read_bytes() == before  # nothing lost
    resumed = _small_run(model, out, 7, "--resume")
    assert resumed.returncode == 0 and "samples=5" in resumed.stdout  # the folder's own settings
    overwritten = _small_run(model, out, 7, "--overwrite")
    assert overwritten.returncode == 0 and "samples=7" in overwritten.stdout


def test_the_dtype_is_the_runs_once_extraction_starts(tmp_path, model):
    """``--dtype`` is part of the run (serve-check serves in it): any command may set it until
    extraction starts, which records it; then another is refused like any other setting."""
    from speculators_compat.pipeline.layout import RunFolder
    from speculators_compat.pipeline.shards import start_shard
    from speculators_compat.pipeline.spec import WHOLE

    out = tmp_path / "r"
    assert _small_run(model, out, 3).returncode == 0
    run = RunFolder(out)
    assert run.spec().dtype is None  # not chosen yet: vLLM's auto, unless extraction picks one
    for dtype in ("bfloat16", "float32"):
        assert run.claim({"dtype": dtype}).dtype == dtype
    start_shard(run, WHOLE, "float32", set())  # what extract does before it touches any file
    before = run.manifest.read_text()
    proc = cli("extract", "--out", out, "--dtype", "bfloat16", "--quiet")
    _fails(proc, "dtype: 'float32' there, 'bfloat16' now", "extracted in float32", "--dtype float32")
    assert run.manifest.read_text() == before
    # not given: the run's own
    assert run.claim({}).dtype == "float32"
    # a run that chose none records what extraction ran in
    other = RunFolder(tmp_path / "other")
    assert _small_run(model, other.root, 3).returncode == 0
    start_shard(other, WHOLE, "auto", set())
    assert other.spec().dtype == "auto"


def test_a_damaged_sample_file_is_named_before_any_stage_reads_it(tmp_path, model):
    """A data_N.pt cut short (a copy interrupted, a flaky disk): vocab and train refuse before
    reading it, naming the file, its size and what extraction wrote; `verify` says the same."""
    run = extracted_by_hand(model, tmp_path / "r", 3)
    victim = run.hidden_states / "data_1.pt"
    size = victim.stat().st_size
    with victim.open("r+b") as f:
        f.truncate(size // 2)
    for stage in ("vocab", "train"):
        proc = cli(stage, "--out", run.root)
        _fails(proc, f"data_1.pt: {size // 2} bytes, extraction wrote {size}", "speculators-compat extract")
        assert "1 of 3 files" in proc.stderr
    verify = cli("verify", "--out", run.root)
    assert verify.returncode == 1, verify.stderr[-3000:]
    assert "3 on disk, 0 missing, 1 damaged" in verify.stdout and "data_1.pt" in verify.stdout
    # without a recorded size (a run extracted before sizes were recorded): the file itself
    record = json.loads(run.extraction_record.read_text())
    record.pop("sizes")
    run.extraction_record.write_text(json.dumps(record))
    _fails(cli("vocab", "--out", run.root), "data_1.pt: not a whole torch file")
    assert victim.stat().st_size == size // 2  # nothing was changed


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (the suite runs as root in CI); skipped where mounting is not allowed."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip() or 'not permitted'}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_full_disk_is_named_and_nothing_partial_is_kept(small_disk):
    """A write that runs out of space (torch's zip writer reports it as a short write, no errno):
    a clear error naming the disk, no partial file, what was written before kept."""
    import torch

    from speculators_compat.pipeline.atomic import DiskFull, write_file

    first = write_file(small_disk / "data_0.pt", lambda tmp: torch.save(torch.zeros(2**18), tmp))  # 1 MiB
    with pytest.raises(DiskFull) as caught:
        write_file(small_disk / "data_1.pt", lambda tmp: torch.save(torch.zeros(2**20), tmp))  # 4 MiB
    message = str(caught.value)
    assert f"the disk holding {small_disk} is full" in message and "writing data_1.pt" in message
    assert "run the same command again" in message
    assert sorted(p.name for p in small_disk.iterdir()) == ["data_0.pt"]  # nothing partial
    assert torch.load(first).numel() == 2**18


def test_extraction_that_cannot_fit_is_refused_before_vllm_starts(tmp_path, small_disk, model):
    """The states' size (tokens x layers x hidden x bytes) against the disk's free space, before
    the engine starts: refused naming both, nothing written."""
    out = small_disk / "r"
    assert _small_run(model, out, 6).returncode == 0
    free = shutil.disk_usage(small_disk).free
    (small_disk / "filler").write_bytes(b"\0" * (free - 16 * 1024))  # 16 KiB left
    proc = cli("extract", "--out", out, "--dtype", "float32", "--quiet")
    _fails(proc, "extracting 6 samples needs about", f"in {out / 'hidden_states'}, and its disk has")
    assert "nothing was written" in proc.stderr
    assert not list((out / "hidden_states").glob("data_*"))


HOLD_CLAIM = """
import sys, time
from speculators_compat.pipeline.layout import RunFolder
with RunFolder(sys.argv[1]).writing(sys.argv[2]):
    print("claimed", flush=True)
    time.sleep(600)
"""


def test_one_writer_per_run_a_live_one_refuses_others_a_dead_ones_claim_is_taken_over(tmp_path, model):
    """Two commands writing one run folder at once (a second `run` started while the first
    trains) overwrite each other's outputs: the second is refused, naming the first; once the
    first is dead (SIGKILL leaves its claim behind) the next command takes the claim over."""
    out = tmp_path / "r"
    assert _small_run(model, out, 3).returncode == 0
    before = (out / "token_freq.pt").read_bytes()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_CLAIM, str(out), "train"], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert holder.stdout.readline().strip() == "claimed"
        second = _small_run(model, out, 3)
        _fails(second, f"a train of this run is running on this machine (pid {holder.pid}, started")
        assert "Wait for it to finish or stop it (nothing was changed)" in second.stderr
        assert (out / "token_freq.pt").read_bytes() == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    writers = json.loads((out / "run.json").read_text())["writers"]
    assert [w["pid"] for w in writers.values()] == [holder.pid]  # left behind by SIGKILL
    again = _small_run(model, out, 3)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "run.json").read_text())["writers"] == {}  # taken over, then given up


def test_a_foreign_folder_is_never_touched(tmp_path, model):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    proc = prepare(model, out, "--overwrite")
    _fails(proc, "holds no speculators-compat run")
    assert (out / "notes.txt").read_text() == "keep me" and len(list(out.iterdir())) == 1


def test_a_later_stage_before_its_input_says_what_to_run(tmp_path, model):
    out = tmp_path / "r"
    assert _small_run(model, out, 5).returncode == 0
    proc = cli("train", "--out", out)
    _fails(proc, "needs the output of extract", "speculators-compat extract")


def test_prepare_reads_a_datasets_folder(tmp_path, model):
    import datasets

    folder = tmp_path / "chats"
    datasets.load_dataset("json", data_files=str(chat_dataset_path()), split="train").select(
        range(6)
    ).save_to_disk(str(folder))
    out = tmp_path / "r"
    proc = prepare(model, out, "--seq-length", 128, data=folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "samples=6" in proc.stdout


def test_an_untested_vllm_is_named_and_the_probes_decide(tmp_path, model):
    from tests.helpers import run_python

    result = run_python(
        f"""
        import json, logging
        from dataclasses import replace
        from packaging.version import Version
        import speculators_compat.versions as v
        fake = replace(v.installed_versions(), vllm=Version("0.99.0"))
        v.installed_versions = lambda: fake
        records = []
        logging.getLogger("speculators_compat").addHandler(logging.Handler())
        logging.getLogger("speculators_compat").handlers[-1].emit = records.append
        from speculators_compat.cli import main
        try:
            main(["prepare", "--model", {str(model)!r}, "--data", {str(chat_dataset_path())!r},
                  "--out", {str(tmp_path / "r")!r}, "--max-samples", "3", "--seq-length", "64", "--quiet"],
                 standalone_mode=False)
        except SystemExit:
            pass
        print(json.dumps({{"warnings": [r.getMessage() for r in records if r.levelname == "WARNING"]}}))
        """
    )
    assert any("vLLM 0.99.0 is outside the versions" in w for w in result["warnings"]), result
    assert (tmp_path / "r" / "prepared").is_dir()  # and the stage still ran


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_dataset_line_cut_in_half_is_named(tmp_path, model, suffix):
    """A ShareGPT file with its fifth record cut in half (a copy interrupted): the message names
    the file and the line (1-based), and nothing is written to the run folder."""
    turns = [[{"from": "human", "value": f"q {i}"}, {"from": "gpt", "value": "a"}] for i in range(8)]
    rows = [json.dumps({"conversations": t}) for t in turns]
    rows[4] = rows[4][: len(rows[4]) // 2]
    data = tmp_path / f"chats{suffix}"
    data.write_text("\n".join(rows) if suffix == ".jsonl" else "[\n" + ",\n".join(rows) + "\n]")
    out = tmp_path / "r"
    proc = prepare(model, out, data=data)
    _fails(proc, f"chats{suffix}", "line 5" if suffix == ".jsonl" else "line 6")
    assert not (out / "prepared").exists()
