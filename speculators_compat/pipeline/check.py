"""Check extracted files against the transformers reference forward of the same model."""

from __future__ import annotations

import json

from .layout import RunFolder


def check_against_reference(run: RunFolder, samples: int = 3) -> float:
    """Worst relative error over the first ``samples`` files and every captured layer."""
    import torch

    from ..oracle.reference import ReferenceModel, relative_error

    config = json.loads((run.hidden_states / "data_config.json").read_text())
    layer_ids = config["hidden_states"]["layer_ids"]
    reference = ReferenceModel(run.spec().model)
    worst = 0.0
    for i in range(samples):
        path = run.hidden_states / f"data_{i}.pt"
        if not path.exists():
            break
        data = torch.load(path, weights_only=True)
        expected = reference.layer_outputs(data["input_ids"].tolist())
        for layer, state in zip(layer_ids, data["hidden_states"], strict=True):
            worst = max(worst, relative_error(state.float(), expected[layer]))
    return worst
