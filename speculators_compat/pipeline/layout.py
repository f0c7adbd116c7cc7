"""The run folder: where each stage writes, and ``run.json``, which says whose run it is.

    RUN/
      run.json              settings of the run and which stages are complete
      regenerated.jsonl     the verifier's own answers: prompt ids, answer ids and text (prepare --regenerate)
      prepared/             token ids and loss masks (a ``datasets`` dataset on disk)
      token_freq.pt         token frequencies of the assistant tokens (speculators' format)
      hidden_states/        data_{i}.pt + data_config.json (speculators 0.3.0's format),
                            extraction.json (dtype; each shard's host, pid and times)
      vocab/                d2t.npy, t2d.npy
      checkpoints/<epoch>/  the draft (speculators' checkpointer; loads with from_pretrained)
      train_metrics.jsonl   one line per training step
      logs/<run>/           TensorBoard event files (train --log-to tensorboard; wandb's files too)
      serve_check.json      the draft served by vLLM's speculative decoding (serve-check)

Processes sharing the folder (``extract --shard`` on several machines) change ``run.json`` one
at a time, under a lock on ``.run.lock`` (``filelock``).

``token_freq.pt`` sits beside ``hidden_states/``, not in it: speculators' loader reads every file
ending in ``pt`` under the data folder as a sample.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock

from .atomic import write_json
from .errors import PipelineError
from .samples import damage, existing_samples
from .spec import IDENTITY, RunSpec

STAGES = ("prepare", "extract", "vocab", "train")

log = logging.getLogger("speculators_compat.pipeline")


def process_start(pid) -> str | None:
    """When process ``pid`` started (``/proc``'s clock ticks since boot), None where it does not
    exist or the system does not say: with the pid, it names one process (a pid is reused)."""
    try:
        return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError, TypeError, ValueError):
        return None


def alive(pid, started: str | None = None) -> bool:
    """Process ``pid`` of this machine still runs (and, where ``started`` was recorded, it is the
    same process, not a later one given the same pid)."""
    try:
        os.kill(int(pid), 0)
    except PermissionError:
        pass  # it exists, another user's
    except (OSError, TypeError, ValueError):
        return False
    now = process_start(pid)
    return started is None or now is None or now == started


class RunFolder:
    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        self.manifest = self.root / "run.json"
        self.lock_file = self.root / ".run.lock"
        self.prepared = self.root / "prepared"
        self.token_freq = self.root / "token_freq.pt"
        self.regenerated = self.root / "regenerated.jsonl"
        self.hidden_states = self.root / "hidden_states"
        #: The dtype of the samples and each shard's host, pid and times (in ``hidden_states/``:
        #: deleting the samples deletes it too).
        self.extraction_record = self.hidden_states / "extraction.json"
        self.vocab = self.root / "vocab"
        self.checkpoints = self.root / "checkpoints"
        self.metrics = self.root / "train_metrics.jsonl"
        self.logs = self.root / "logs"
        self.serve_report = self.root / "serve_check.json"

    # -- manifest ---------------------------------------------------------------------
    def read(self) -> dict:
        if not self.manifest.is_file():
            return {"settings": {}, "stages": {}}
        try:
            return json.loads(self.manifest.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise PipelineError(
                f"{self.manifest} is unreadable ({exc}); this folder's run cannot be continued. "
                "Choose a new --out folder."
            ) from None

    def settings(self) -> dict:
        return self.read()["settings"]

    def captured_layer_ids(self) -> list[int]:
        """The verifier layers the samples hold (``data_config.json``, speculators' convention:
        each layer's output)."""
        config = self.hidden_states / "data_config.json"
        if not config.is_file():
            raise PipelineError(f"{config} is missing: run extract first.")
        return list(json.loads(config.read_text())["hidden_states"]["layer_ids"])

    def spec(self) -> RunSpec:
        """The run this folder holds (refused, saying how to start one, where it holds none)."""
        return RunSpec.from_settings(self.settings(), self.root)

    def extraction_started(self) -> bool:
        """Samples were extracted (or are being extracted) here: their dtype is fixed."""
        return self.extraction_record.is_file() or (
            self.hidden_states.is_dir() and any(self.hidden_states.glob("data_*.pt"))
        )

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """No other process of this run (another shard, on this machine or another) changes the
        folder's records (``run.json``, ``hidden_states/extraction.json``) inside the block."""
        self.root.mkdir(parents=True, exist_ok=True)
        with FileLock(self.lock_file):
            yield

    @contextlib.contextmanager
    def update(self) -> Iterator[dict]:
        """``run.json``'s content, written back when the block ends (not if it raises), under
        :meth:`lock`."""
        with self.lock():
            state = self.read()
            yield state
            write_json(self.manifest, state)

    def claim(self, identity: dict, *, resume: bool = False, overwrite: bool = False) -> RunSpec:
        """Make this folder hold the run with ``identity`` (a :class:`RunRequest`'s: the values a
        command gives); returns the run in force.

        A folder holding a different run is refused unless ``resume`` (keep its settings and
        continue it) or ``overwrite`` (delete its outputs and start this run). The dtype may
        change until extraction starts."""
        settings = {k: v for k, v in identity.items() if v is not None}
        unknown = set(settings) - set(IDENTITY)
        if unknown:
            raise ValueError(f"not identity settings: {sorted(unknown)}")
        others = self.root.is_dir() and any(p != self.lock_file for p in self.root.iterdir())
        if not self.manifest.is_file() and others:
            raise PipelineError(
                f"{self.root} is not empty and holds no speculators-compat run (no run.json); "
                "nothing there is touched. Choose an empty or new --out folder."
            )
        with self.update() as state:
            self._claim(state, settings, resume, overwrite)
        return self.spec()

    def _claim(self, state: dict, settings: dict, resume: bool, overwrite: bool) -> None:
        old = state["settings"]
        if old and "dtype" not in old and self.extraction_record.is_file():
            # a folder of an earlier version: its samples' dtype is in the extraction record only
            recorded = json.loads(self.extraction_record.read_text()).get("dtype")
            if recorded:
                old["dtype"] = recorded
        differs = {
            k: (old[k], settings[k]) for k in IDENTITY if k in old and k in settings and old[k] != settings[k]
        }
        if "dtype" in differs and not self.extraction_started():
            del differs["dtype"]  # nothing extracted yet: this command's dtype is the run's
        if differs and overwrite:
            self.clear()
            state.clear()
            state.update(settings={}, stages={})
        elif differs and resume:
            settings = {**settings, **{k: old[k] for k in differs}}
        elif differs:
            lines = "; ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in differs.items())
            dtype = ""
            if "dtype" in differs:
                there, now = differs["dtype"]
                dtype = (
                    f" Its samples were extracted in {there}: pass --dtype {there} to continue them, or "
                    f"delete {self.hidden_states} to extract them again in {now}."
                )
            raise PipelineError(
                f"{self.root} already holds a different run ({lines}).{dtype} Pass --resume to "
                "continue that run with its own settings, --overwrite to delete its outputs and start "
                "this one, or choose another --out folder. Nothing was changed."
            )
        state["settings"] = {**state["settings"], **settings}

    @contextlib.contextmanager
    def writing(self, stage: str) -> Iterator[None]:
        """This process writes ``stage``'s outputs for the block: a claim in ``run.json``
        (host, pid, its start, the stage), taken under :meth:`lock` and given up when the block
        ends. Refused while another live process of this machine writes this run (extractions
        excepted, of one another: their shards check their own overlap); a claim from another
        machine is warned of; a dead one is taken over. Under ``torchrun`` rank 0 claims for the
        job."""
        if os.environ.get("RANK", "0") != "0":
            yield
            return
        host, pid = socket.gethostname(), os.getpid()
        me = f"{host}:{pid}"
        with self.update() as state:
            writers = state.setdefault("writers", {})
            for key, entry in list(writers.items()):
                if key == me:
                    continue
                if entry.get("host") != host:
                    log.warning(
                        "a %s of this run started on %s (pid %s) at %s and has not finished: if it "
                        "still runs, stop this command (two processes writing one run folder "
                        "overwrite each other's outputs)",
                        entry.get("stage"),
                        entry.get("host"),
                        entry.get("pid"),
                        entry.get("started_at"),
                    )
                elif not alive(entry.get("pid"), entry.get("process_start")):
                    del writers[key]  # it died: its claim is this command's now
                elif not (stage == "extract" and entry.get("stage") == "extract"):
                    raise PipelineError(
                        f"a {entry.get('stage')} of this run is running on this machine (pid "
                        f"{entry.get('pid')}, started {entry.get('started_at')}); this {stage} "
                        f"would write {self.root} beside it. Wait for it to finish or stop it "
                        "(nothing was changed)."
                    )
            writers[me] = {
                "stage": stage,
                "host": host,
                "pid": pid,
                "process_start": process_start(pid),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
        try:
            yield
        finally:
            if self.manifest.is_file():
                with self.update() as state:
                    state.get("writers", {}).pop(me, None)

    def clear(self) -> None:
        for p in (self.prepared, self.hidden_states, self.vocab, self.checkpoints, self.logs):
            shutil.rmtree(p, ignore_errors=True)
        for p in (self.token_freq, self.regenerated, self.metrics, self.serve_report, self.manifest):
            p.unlink(missing_ok=True)

    def done(self, stage: str) -> dict | None:
        return self.read()["stages"].get(stage)

    def mark_done(self, stage: str, **facts) -> None:
        with self.update() as state:
            # Later stages depend on this one's outputs: they are no longer complete.
            self.unmark(stage, state)
            state["stages"][stage] = {"finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **facts}

    def unmark(self, stage: str, state: dict) -> None:
        """In ``state`` (from :meth:`update`): ``stage`` and the stages after it are not complete."""
        for later in STAGES[STAGES.index(stage) :]:
            state["stages"].pop(later, None)

    def require(self, stage: str, needed_by: str) -> dict:
        facts = self.done(stage)
        if facts is None:
            raise PipelineError(
                f"{needed_by} needs the output of {stage}, which {self.root} does not have yet. "
                f"Run `speculators-compat {stage} --out {self.root}` first (or `run`)."
            )
        return facts

    # -- the samples (gates for the stages that read them) ------------------------------
    def extraction_state(self) -> dict:
        """``hidden_states/extraction.json``: the samples' dtype and each shard's host, pid and
        times (:mod:`.shards` writes it)."""
        path = self.extraction_record
        return json.loads(path.read_text()) if path.is_file() else {"dtype": None, "shards": {}}

    def missing_samples(self, samples: int) -> list[int]:
        """Which of the ``samples`` prepared samples have no ``data_{i}.pt`` here."""
        have = existing_samples(self.hidden_states)
        return [i for i in range(samples) if i not in have]

    def damaged_samples(self, samples: int, owned=None) -> dict[int, str]:
        """The sample files here (of the first ``samples``; where ``owned``, those it accepts)
        that are not what extraction wrote: ``{i: what is wrong}``."""
        sizes = self.extraction_state().get("sizes", {})
        found = {}
        for i in sorted(existing_samples(self.hidden_states)):
            if i < samples and (owned is None or owned(i)):
                recorded = sizes.get(str(i))
                what = damage(self.hidden_states / f"data_{i}.pt", recorded)
                if what:
                    found[i] = what
        return found

    def describe_missing(self, missing: list[int]) -> str:
        """The missing sample indices, and for each shard count on record, which of its shards
        own them and whether they finished (host, pid, times)."""
        lines = [f"samples {_ranges(missing)}"]
        shards = self.extraction_state().get("shards", {})
        counts = sorted({int(name.split("/")[1]) for name in shards})
        for n in counts:
            for index in sorted({i % n for i in missing}):
                entry = shards.get(f"{index}/{n}")
                if entry is None:
                    how = "never started"
                elif entry.get("finished_at") is None:
                    how = (
                        f"started on {entry['host']} (pid {entry['pid']}) at {entry['started_at']}, "
                        "not finished"
                    )
                else:
                    how = f"finished at {entry['finished_at']}, its files deleted since"
                lines.append(f"{f'shard {index}/{n}' if n > 1 else 'extraction without --shard'}: {how}")
        return "; ".join(lines)

    def require_all_samples(self, needed_by: str) -> None:
        """Every prepared sample's hidden states are on disk and the extraction is complete: a
        training set with samples missing (a shard that did not finish) is refused, naming them."""
        samples = self.require("prepare", needed_by)["samples"]
        missing = self.missing_samples(samples)
        if len(missing) == samples and not self.extraction_record.is_file():
            self.require("extract", needed_by)  # never started: the plain "run extract first"
        if missing:
            raise PipelineError(
                f"{needed_by} needs every sample's hidden states; {len(missing)} of {samples} are "
                f"not in {self.hidden_states}: {self.describe_missing(missing)}. Run "
                f"`speculators-compat extract --out {self.root}` (or, on each machine, the "
                "unfinished --shard I/N) to extract them; nothing was changed."
            )
        self.require("extract", needed_by)
        damaged = self.damaged_samples(samples)
        if damaged:
            shown = "; ".join(f"data_{i}.pt: {what}" for i, what in list(damaged.items())[:5])
            raise PipelineError(
                f"{needed_by} needs every sample's hidden states; {len(damaged)} of {samples} files in "
                f"{self.hidden_states} are damaged ({shown}{'; ...' if len(damaged) > 5 else ''}). Run "
                f"`speculators-compat extract --out {self.root}` to extract them again (it sets the "
                "damaged files aside as data_N.pt.damaged); nothing was changed."
            )


def _ranges(indices: list[int], limit: int = 12) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"`` (at most ``limit`` runs, then how many more)."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:limit])
    return text + (f", ... ({len(runs) - limit} more runs)" if len(runs) > limit else "")
