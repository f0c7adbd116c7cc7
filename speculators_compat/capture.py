"""Worker-side hidden-state capture: forward hooks on the model's own decoder layers.

speculators 0.3.0 replaced the base model's ``forward`` with its own copy of a Llama-style loop
(``get_input_embeddings``, ``layer(hidden_states=, positions=, residual=)``), which drifts from
every model and vLLM release that does it differently. Here the model runs its own forward and a
hook on each requested layer records the layer's **output** (``hidden_states + residual``, the
speculators 0.3.0 convention).

Attribution: every ``execute_model`` step the runner lays its batch out request by request in
``input_batch.req_ids`` order, each with ``scheduler_output.num_scheduled_tokens[req_id]``
tokens. After the step the captured rows are split along that layout and appended to each
request's own buffer, so chunked prefill, batches larger than ``max_num_seqs`` and requests
reordered by vLLM all land on the right sequence.

Transfer: :meth:`CaptureState.take_packed` hands a batch's states to the driver as one byte
array per request and layer (the captured rows themselves where a request was prefilled in one
step), which vLLM's message queue (0.12+) sends as pickle-5 out-of-band buffers; a torch tensor
would be pickled through ``torch.save`` into bytes, several copies per tensor.
:func:`unpack_states` gives each request its own tensors, copying only what arrived in memory
that is not the driver's to keep (vLLM's shared-memory ring, which the next message reuses).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections import OrderedDict

import torch

__all__ = ["CaptureState", "find_decoder_layers", "release_free_memory", "unpack_states"]

# release_free_memory() costs milliseconds, and the pages it gives back fault in again when the
# next batch reuses them: the worker calls it once per this many bytes of states handed to the
# driver. Measured (benchmarks/, deepseek-v3-tiny, ~12 MiB of states per batch, vLLM 0.16, 2 CPUs):
# every batch: capture 0.85 of vLLM's prefill, extract's peak memory 1,000/100 sequences 1.05;
# every 128 MiB: 1.01 and 1.12; every 32 MiB: 0.93 and 1.10. A real model's batch exceeds it.
RELEASE_EVERY_BYTES = 32 * 2**20


def find_decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder-layer list of a vLLM model, also inside multimodal wrappers."""
    lists = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and name.split(".")[-1] == "layers"
    ]
    preferred = [(n, m) for n, m in lists if n.split(".")[-2:] == ["model", "layers"]]
    # Text models: "model.layers"; wrappers: "language_model.model.layers". Vision towers have
    # "layers" lists of their own, so a "model.layers" list wins, and the longest list after it.
    candidates = preferred or sorted(lists, key=lambda nm: -len(nm[1]))
    if not candidates:
        raise LookupError(f"no decoder layers found in {type(model).__name__}")
    return candidates[0][1]


def layer_output(output) -> torch.Tensor:
    """A decoder layer's output as speculators 0.3.0 defines it: hidden + residual."""
    if isinstance(output, tuple):
        hidden, residual = output[0], output[1] if len(output) > 1 else None
        return hidden if residual is None else hidden + residual
    return output


class CaptureState:
    """Hooks on the chosen layers, per-step rows, and per-request buffers (on CPU)."""

    def __init__(self, model: torch.nn.Module, layer_ids=None, enabled: bool = True):
        """Hook ``layer_ids`` (every decoder layer when None) of ``model``."""
        layers = find_decoder_layers(model)
        ids = sorted(set(int(i) for i in layer_ids)) if layer_ids is not None else list(range(len(layers)))
        bad = [i for i in ids if not 0 <= i < len(layers)]
        if bad:
            raise ValueError(
                f"layer ids {bad} are out of range: the model has {len(layers)} decoder layers "
                f"(valid ids 0-{len(layers) - 1})"
            )
        self.layer_ids = ids
        self.enabled = enabled
        self.step: list[list[torch.Tensor]] = [[] for _ in ids]
        self.requests: OrderedDict[str, list[list[torch.Tensor]]] = OrderedDict()
        self.handles = []
        self.taken_since_release = 0
        if enabled:
            for pos, idx in enumerate(ids):
                self.handles.append(layers[idx].register_forward_hook(self._hook(pos)))

    def _hook(self, pos: int):
        def hook(_module, _args, output):
            self.step[pos].append(layer_output(output).detach())

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def begin_step(self) -> None:
        self.step = [[] for _ in self.layer_ids]

    def end_step(self, req_ids: list[str], num_scheduled_tokens: dict[str, int]) -> None:
        """Split this step's rows by the batch layout and file them under each request."""
        if not self.enabled or not req_ids:
            return
        counts = [int(num_scheduled_tokens[r]) for r in req_ids]
        total = sum(counts)
        for pos, chunks in enumerate(self.step):
            if not chunks:
                raise RuntimeError(
                    f"no hidden states were captured for layer {self.layer_ids[pos]} in a step "
                    f"that scheduled {total} tokens"
                )
            rows = torch.cat(chunks)[:total] if len(chunks) > 1 else chunks[0][:total]
            if rows.shape[0] != total:
                raise RuntimeError(
                    f"layer {self.layer_ids[pos]}: captured {rows.shape[0]} rows for a step "
                    f"that scheduled {total} tokens"
                )
            rows = rows.to("cpu")
            for req_id, part in zip(req_ids, torch.split(rows, counts), strict=True):
                buf = self.requests.setdefault(req_id, [[] for _ in self.layer_ids])
                buf[pos].append(part)
        self.begin_step()

    def take(self, req_ids: list[str]) -> dict[str, list[torch.Tensor]]:
        """Per-layer states of each request (concatenated over its chunks), then forget them."""
        out = {}
        for r in req_ids:
            buf = self.requests.pop(r, None)
            if buf is not None:
                out[r] = [torch.cat(chunks) if chunks else torch.empty(0) for chunks in buf]
        return out

    def take_packed(self, req_ids: list[str]) -> dict:
        """:meth:`take`, packed for the trip to the driver (:func:`unpack_states` reverses it).

        ``{"req_ids": [...], "layers": [{"dtype", "arrays"} per layer]}``: ``arrays`` holds, per
        request, a uint8 numpy array of shape (its rows, hidden size * item size), or None when
        it has no rows. A request prefilled in one step sends a view of that step's rows (no
        copy here); one prefilled in several steps, its chunks joined (one copy).
        """
        bufs = [(r, self.requests.pop(r)) for r in req_ids if r in self.requests]
        layers = []
        for pos in range(len(self.layer_ids)):
            arrays, dtype = [], None
            for _, buf in bufs:
                chunks = buf[pos]
                rows = chunks[0] if len(chunks) == 1 else torch.cat(chunks) if chunks else None
                if rows is None or not rows.numel():
                    arrays.append(None)
                    continue
                dtype = rows.dtype
                data = rows.contiguous().view(torch.uint8).numpy()
                self.taken_since_release += data.nbytes
                arrays.append(data)
            layers.append({"dtype": str(dtype or torch.float32).removeprefix("torch."), "arrays": arrays})
        return {"req_ids": [r for r, _ in bufs], "layers": layers}

    def release_memory_now_and_then(self) -> None:
        """:func:`release_free_memory` once :data:`RELEASE_EVERY_BYTES` of states were taken."""
        if self.taken_since_release >= RELEASE_EVERY_BYTES:
            release_free_memory()
            self.taken_since_release = 0

    def take_all_flat(self) -> list[torch.Tensor] | None:
        """speculators 0.3.0's shape: one tensor per layer, requests in order of first capture."""
        if not self.requests:
            return None
        per_req = self.take(list(self.requests))
        return [torch.cat([layers[pos] for layers in per_req.values()]) for pos in range(len(self.layer_ids))]


def unpack_states(packed: dict) -> dict[str, list[torch.Tensor]]:
    """:meth:`CaptureState.take_packed`'s result as ``take()`` gives it: per request, per layer.

    Every tensor owns exactly its own rows (``torch.save`` of one sample writes only those), and
    none refers to memory that can change afterwards: an array that arrived in memory the driver
    does not own for good (vLLM's shared-memory ring, reused by the next message; anything not
    known to be the driver's) is copied; one that arrived in a buffer of its own (a zmq frame,
    pickled bytes) is used as it is.
    """
    out: dict[str, list[torch.Tensor]] = {r: [] for r in packed["req_ids"]}
    for layer in packed["layers"]:
        dtype = getattr(torch, layer["dtype"])
        for req_id, data in zip(packed["req_ids"], layer["arrays"], strict=True):
            if data is None:
                out[req_id].append(torch.empty(0, dtype=dtype))
                continue
            if not _kept_by_driver(data):
                data = data.copy()
            out[req_id].append(torch.from_numpy(data).view(dtype))
    return out


def _kept_by_driver(array) -> bool:
    """Whether ``array``'s memory is the driver's for as long as it holds the array, and holds
    only this array: its own allocation, pickled bytes, or a zmq frame (vLLM's queue sends a
    message too large for its shared-memory ring through zmq, one frame per buffer). A view into
    the ring (an ``mmap``), or into anything else, is not."""
    import numpy as np

    root = array
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    pickled = isinstance(root, memoryview) and isinstance(root.obj, bytes | bytearray)
    if isinstance(root, np.ndarray) or pickled:  # an array that owns its data, or pickled bytes
        whole = root
    elif type(root).__module__.startswith("zmq.") and type(root).__name__ == "Frame":
        whole = memoryview(root)
    else:
        return False
    return memoryview(whole).nbytes == array.nbytes


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def release_free_memory() -> None:
    """Give the C heap's free pages back to the system (glibc ``malloc_trim``; elsewhere nothing).

    A batch's states are large short-lived allocations; without this, glibc keeps the freed
    memory in its arenas and the worker's resident size creeps up with the number of batches.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
