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
"""

from __future__ import annotations

from collections import OrderedDict

import torch

__all__ = ["CaptureState", "find_decoder_layers"]


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

    def take_all_flat(self) -> list[torch.Tensor] | None:
        """speculators 0.3.0's shape: one tensor per layer, requests in order of first capture."""
        if not self.requests:
            return None
        per_req = self.take(list(self.requests))
        return [torch.cat([layers[pos] for layers in per_req.values()]) for pos in range(len(self.layer_ids))]
