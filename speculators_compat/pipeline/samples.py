"""The sample files: one ``data_{i}.pt`` per prepared sample ``i`` in speculators 0.3.0's format
(what its data loader reads), each written whole under a temporary name and renamed, so a file
that exists is complete; the check that a batch's states cover their tokens before any of it is
written; and the writer thread that writes one batch while the next is generated.
"""

from __future__ import annotations

import logging
import re
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .atomic import write_file
from .errors import PipelineError

log = logging.getLogger("speculators_compat.pipeline")
_SAMPLE = re.compile(r"^data_(\d+)\.pt$")


def sample_index(path: str | Path) -> int | None:
    """``i`` of a ``data_{i}.pt`` file, None for any other name."""
    m = _SAMPLE.match(Path(path).name)
    return int(m.group(1)) if m else None


def existing_samples(folder: Path) -> set[int]:
    if not folder.is_dir():
        return set()
    return {i for p in folder.iterdir() if (i := sample_index(p)) is not None}


def sample_record(input_ids, hidden_states, loss_mask) -> dict:
    """One ``data_{i}.pt`` as speculators' data loader reads it. ``torch.save`` writes a tensor's
    whole storage: a state that is a view into a larger one (speculators' own generator returns
    slices of one batch tensor) is copied into storage of its own; a state that owns its storage
    (what ``unpack_states`` gives each request) is saved as it is, without another copy."""
    import torch

    return {
        "input_ids": torch.as_tensor(input_ids, dtype=torch.long),
        "hidden_states": [_owning(h) for h in hidden_states],
        "loss_mask": torch.as_tensor(loss_mask, dtype=torch.long),
    }


def _owning(state):
    import torch

    owns = (
        state.is_contiguous()
        and state.storage_offset() == 0
        and state.untyped_storage().nbytes() == state.nbytes
    )
    return state if owns else state.clone(memory_format=torch.contiguous_format)


def uncovered_rows(hidden_states, tokens: int) -> list[int] | None:
    """The rows of each layer's states where some layer has not exactly one per token, else None."""
    rows = [len(layer) for layer in hidden_states]
    return rows if set(rows) != {tokens} else None


def check_batch(chunk: list[int], rows: list[dict], results: list[dict], kept: int) -> None:
    """Each sample's states cover its own tokens, one row per token in every layer, before any
    of the batch is written: states that come back short have been sliced from another sequence's
    (speculators 0.3.0's offset slicing under chunked prefill, speculators #279), and training on
    them would be silently wrong. Stops the run naming the samples; ``kept`` samples already on disk stay."""
    bad = []
    for i, row, result in zip(chunk, rows, results, strict=True):
        ids = result["input_ids"]
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        n = len(ids)
        if ids != list(row["input_ids"][:n]) or uncovered_rows(result["hidden_states"], n):
            per_layer = [len(h) for h in result["hidden_states"]]
            bad.append(f"sample {i}: {n} tokens, states {per_layer} rows a layer")
    if bad:
        raise PipelineError(
            f"speculators' generator returned states that do not cover their own tokens for "
            f"{len(bad)} of {len(chunk)} samples of a batch ({'; '.join(bad[:3])}"
            f"{'; ...' if len(bad) > 3 else ''}): states sliced from other sequences (speculators "
            "#279; the token_attribution shim fixes it: is it disabled in "
            "SPECULATORS_COMPAT_DISABLE, or reported failed by `speculators-compat status`?). Nothing "
            f"of this batch was written; the {kept} samples already on disk are kept."
        )


def write_batch(out: Path, chunk: list[int], rows: list[dict], results: list[dict], on_written=None) -> int:
    """One batch's samples as ``data_{i}.pt`` (each written whole, then renamed); returns how many.
    ``on_written`` gets ``{i: bytes}`` of the files written (what :func:`damage` checks later)."""
    import torch

    sizes = {}
    for i, row, result in zip(chunk, rows, results, strict=True):
        n = len(result["input_ids"])
        sample = sample_record(result["input_ids"], result["hidden_states"], row["loss_mask"][:n])
        path = out / f"data_{i}.pt"
        write_file(path, lambda tmp, s=sample: torch.save(s, tmp))
        sizes[i] = path.stat().st_size
    if on_written is not None:
        on_written(sizes)
    return len(chunk)


def damage(path: Path, recorded: int | None) -> str | None:
    """What is wrong with the sample file ``path`` (None: nothing found), cheaply: its size
    against the ``recorded`` one (what extraction wrote), and whether it is a whole torch file
    (``torch.save`` writes a zip archive; a cut one has no central directory at its end)."""
    size = path.stat().st_size
    if recorded is not None and size != recorded:
        return f"{size} bytes, extraction wrote {recorded}"
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        return f"not a whole torch file ({exc})"
    return None


class BatchWriter:
    """Writes one batch's files on a thread of its own while the next batch is generated.

    At most one batch is being written at a time: :meth:`submit` first waits for the one before,
    so the driver holds at most two batches of states (the one being written, the one just
    generated). A failed write is raised by the next :meth:`submit` or :meth:`finish`; files are
    written whole and renamed, so whatever is on disk is complete.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="extract-writer")
        self._pending = None

    def submit(self, write) -> int:
        """Start writing a batch; returns how many samples the batch before it wrote."""
        done = self.finish()
        self._pending = self._pool.submit(write)
        return done

    def finish(self) -> int:
        """Wait for the batch being written (raising its error); how many samples it wrote."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else 0

    def close(self) -> None:
        """Let a batch being written finish (its error is logged: another is on its way up)."""
        try:
            self.finish()
        except Exception as exc:  # noqa: BLE001 (the exception already propagating wins)
            log.error("writing a batch of samples failed too: %s: %s", type(exc).__name__, exc)
        finally:
            self._pool.shutdown(wait=True)


def vllm_aux_layer_ids(captured: list[int]) -> list[int]:
    """vLLM's ``eagle_aux_hidden_state_layer_ids`` for data captured at speculators' ``captured``
    layer ids (three auxiliary layers, then the target layer): each auxiliary layer's output is
    the state entering the next layer."""
    if len(captured) < 2:
        raise ValueError(f"expected auxiliary layer ids and a final one, got {captured}")
    return [k + 1 for k in captured[:-1]]
