"""Extraction shards (``extract --shard I/N``, e.g. one per machine, all sharing the run folder).

Shard ``I`` owns the samples ``i`` with ``i % N == I`` and extracts (and cleans up after) only
those, so shards of one ``N`` run at once without touching each other's files; each resumes on
its own. ``hidden_states/extraction.json`` (:attr:`RunFolder.extraction_record`) records the
samples' dtype and each shard's host, pid and times: a shard starting refuses another dtype and,
on this machine, an overlapping extraction that is still alive.
"""

from __future__ import annotations

import logging
import os
import socket
import time

from .atomic import write_json
from .errors import PipelineError
from .layout import RunFolder, alive
from .spec import Shard

log = logging.getLogger("speculators_compat.pipeline")


def start_shard(run: RunFolder, shard: Shard, wanted: str, have: set[int]) -> None:
    """Samples on disk (or being written by another shard) are in one dtype: refuse to add
    others in another (the set would end mixed, and data_config.json could record only one).
    Records the dtype and this shard's start otherwise; until the extraction completes again,
    it and the stages after it are not complete."""
    with run.update() as state:  # shards starting at once see each other's record
        run.unmark("extract", state)
        record = run.extraction_state()
        before = record.get("dtype")
        if before is not None and before != wanted:
            raise PipelineError(
                f"{len(have)} samples in {run.hidden_states} were extracted in dtype {before} (or "
                f"are being extracted: {run.extraction_record.name} records it); this command "
                f"extracts in {wanted}. Pass --dtype {before} to continue them, or delete "
                f"{run.hidden_states} to extract every sample in {wanted} (nothing was changed)."
            )
        _no_overlap(record.get("shards", {}), shard)
        record["dtype"] = wanted
        state["settings"].setdefault("dtype", wanted)  # the run's from now on (serving too)
        record.setdefault("shards", {})[str(shard)] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "finished_at": None,
        }
        write_json(run.extraction_record, record)


def _no_overlap(shards: dict, shard: Shard) -> None:
    """Refuse to start while an extraction whose samples overlap this one's runs on this machine
    (the same shard twice, or another shard count): both would extract the same samples and
    remove each other's files being written. On other machines it can only be warned of."""
    host = socket.gethostname()
    for name, entry in shards.items():
        if entry.get("finished_at") is not None or entry.get("pid") == os.getpid():
            continue
        if name != str(shard) and int(name.split("/")[1]) == shard.count:
            continue  # another shard of the same split: no sample in common
        what = f"extraction {'--shard ' + name if name != '0/1' else 'without --shard'}"
        if entry.get("host") == host:
            if not alive(entry.get("pid")):
                continue  # it died (a resumed run): its leftovers are this command's to clean up
            raise PipelineError(
                f"an {what} of this run is running on this machine (pid {entry['pid']}, started "
                f"{entry['started_at']}); this command's samples overlap its. Wait for it or stop "
                "it; shards running at once must share N and differ in I (nothing was changed)."
            )
        log.warning(
            "an %s of this run started on %s (pid %s) at %s and did not finish: if it still runs, "
            "stop this command (shards running at once must share N and differ in I)",
            what,
            entry.get("host"),
            entry.get("pid"),
            entry.get("started_at"),
        )


def finish_shard(run: RunFolder, shard: Shard, extracted: int) -> None:
    with run.lock():
        record = run.extraction_state()
        entry = record.setdefault("shards", {}).setdefault(str(shard), {})
        entry.update(finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), extracted=extracted)
        write_json(run.extraction_record, record)


def record_sizes(run: RunFolder, sizes: dict[int, int]) -> None:
    """Each written sample's size in ``extraction.json`` (checked before training reads them)."""
    with run.lock():
        record = run.extraction_state()
        record.setdefault("sizes", {}).update({str(i): n for i, n in sizes.items()})
        write_json(run.extraction_record, record)
