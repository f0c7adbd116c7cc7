"""Harness for the draft/training shims: run in a fresh process (``python -m tests.shims.run_draft
MODE``) with some shims disabled; prints one JSON line ``{"ok": ..., ...}``.

Modes
- targets: the draft's training targets vs the verifier's real logits (deepseek-v3-tiny)
- kimi: build the draft on the Kimi-K2.5 wrapper; its embeddings vs the checkpoint's
- step: one training step of speculators' Trainer on CPU
- attention_bf16: the draft's attention under bfloat16 autocast with float32 q/k, bfloat16 v
- resume: train one epoch, then resume the same run for a second
- resume_lr: the learning rates and metric steps of a resumed epoch against the uninterrupted run's
- load: save the draft with speculators' checkpointer, load it with from_pretrained
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback
from pathlib import Path

import speculators_compat  # noqa: F401  (activates the shims)


def _draft(recipe: str):
    import torch
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    from speculators_compat.pipeline.model_info import inspect_model
    from speculators_compat.pipeline.train import transformer_layer_config
    from speculators_compat.tiny import build

    path = build(recipe, "float32")
    info = inspect_model(path)
    layer_config, _ = transformer_layer_config(info, 1)
    t2d = torch.zeros(info.vocab_size, dtype=torch.bool)
    t2d[torch.arange(0, info.vocab_size, 3)] = True
    d2t = torch.nonzero(t2d).flatten() - torch.arange(int(t2d.sum()))
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config,
        draft_vocab_size=int(t2d.sum()),
        norm_before_residual=True,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=2)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(path), architectures=list(info.architectures)),
        ),
    )
    return Eagle3DraftModel(config=config, t2d=t2d, d2t=d2t), path, info, t2d


def targets() -> dict:
    import torch

    from speculators_compat.oracle.reference import ReferenceModel, relative_error
    from speculators_compat.tiny import sample_token_ids

    draft, path, _, t2d = _draft("deepseek-v3-tiny")
    reference = ReferenceModel(path)
    ids = sample_token_ids(path, 1)[0]
    last = reference.layer_outputs(ids)[-1]
    with torch.no_grad():
        got = draft.verifier_lm_head(last)
        logits = reference.model(torch.tensor([ids])).logits[0].float()[:, t2d]
    saved = set(draft.state_dict())
    return {
        "error": relative_error(got, logits),
        "argmax_agree": float((got.argmax(-1) == logits.argmax(-1)).float().mean()),
        "extra_saved_keys": sorted(k for k in saved if "norm_weight" in k),
    }


def kimi() -> dict:
    from safetensors import safe_open

    draft, path, _, t2d = _draft("kimi-k25-tiny")
    with safe_open(Path(path) / "model.safetensors", framework="pt") as f:
        embed = f.get_tensor("language_model.model.embed_tokens.weight")
        head = f.get_tensor("language_model.lm_head.weight")
    return {
        "embed_equal": bool((draft.embed_tokens.weight == embed).all()),
        "head_equal": bool((draft.lm_head.weight == head[t2d]).all()),
    }


def _trainer(draft, out: Path, epochs: int, info):
    import torch
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn
    from speculators.train.trainer import Trainer, TrainerConfig
    from torch.utils.data import DataLoader

    data = out / "data"
    if not data.exists():
        data.mkdir(parents=True)
        g = torch.Generator().manual_seed(0)
        for i in range(4):
            n = 40
            sample = {
                "input_ids": torch.randint(0, info.vocab_size, (n,), generator=g),
                "hidden_states": [torch.randn(n, info.hidden_size, generator=g) for _ in range(4)],
                "loss_mask": torch.ones(n, dtype=torch.long),
            }
            torch.save(sample, data / f"data_{i}.pt")
    dataset = Eagle3SampleFileDataset(max_len=128, datapath=str(data))
    loader = DataLoader(dataset, batch_size=2, collate_fn=create_collate_fn(128))
    call = {"ttt_steps": 2, "ttt_step_loss_decay": 1.0, "use_off_policy_tokens": False}
    config = TrainerConfig(
        lr=1e-3,
        num_epochs=epochs,
        save_path=str(out / "ckpt"),
        resume_from_checkpoint=True,
        local_rank=torch.device("cpu"),
        train_call_kwargs=call,
        val_call_kwargs=call,
    )
    return Trainer(draft, config, loader, None)


def step() -> dict:
    draft, _, info, _ = _draft("deepseek-v3-tiny")
    with tempfile.TemporaryDirectory() as tmp:
        _trainer(draft, Path(tmp), 1, info).run_training()
    return {}


def attention_bf16() -> dict:
    """speculators' draft attention (``simple_flex_attention``) under bfloat16 autocast, given
    what its layer hands it on a GPU there: q and k in float32 (the rotary embedding's cos/sin
    are made in the layer input's dtype), v in bfloat16 (its projection under autocast)."""
    import importlib

    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    attention = importlib.import_module("speculators.models.eagle3.attention")
    total = 128
    mask = attention.create_combined_mask_mod(torch.tensor([80, 48]), total)
    block_mask = create_block_mask(mask, None, None, total, total, device="cpu")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, total, 16, generator=g) for _ in range(3))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = attention.flex_attention_forward(None, q, k, v.bfloat16(), block_mask, scaling=0.25)
        reference, _ = attention.flex_attention_forward(
            None, q.bfloat16(), k.bfloat16(), v.bfloat16(), block_mask, scaling=0.25
        )
    difference = float((out.float() - reference.float()).abs().max())
    return {"dtype": str(out.dtype), "max_difference": difference, "torch": torch.__version__}


def resume() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        draft, _, info, _ = _draft("deepseek-v3-tiny")
        _trainer(draft, Path(tmp), 1, info).run_training()
        draft, _, info, _ = _draft("deepseek-v3-tiny")
        trainer = _trainer(draft, Path(tmp), 2, info)
        start = trainer.current_epoch
        trainer.run_training()
        return {"resumed_at_epoch": start, "epochs": sorted(p.name for p in (Path(tmp) / "ckpt").iterdir())}


def resume_lr() -> dict:
    """Train 2 epochs; then, from a copy of the first epoch's checkpoint alone, resume the same
    run (2 epochs): the learning rates of the second epoch, uninterrupted and resumed."""
    import logging
    import shutil

    # (epoch, step, lr) of every metric record: training steps carry a rate, validation None
    records: list[tuple[int, int, float | None]] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append((r.msg["epoch"], r.step, r.msg.get("lr")))
    metrics = logging.getLogger("speculators.metrics")
    metrics.setLevel(logging.INFO)
    metrics.addHandler(handler)
    with tempfile.TemporaryDirectory() as tmp:
        whole, resumed = Path(tmp) / "whole", Path(tmp) / "resumed"
        draft, _, info, _ = _draft("deepseek-v3-tiny")
        _trainer(draft, whole, 2, info).run_training()
        uninterrupted = [(step, lr) for epoch, step, lr in records if epoch == 1]
        shutil.copytree(whole / "data", resumed / "data")
        shutil.copytree(whole / "ckpt" / "0", resumed / "ckpt" / "0")
        records.clear()
        draft, _, info, _ = _draft("deepseek-v3-tiny")
        trainer = _trainer(draft, resumed, 2, info)
        start = trainer.current_epoch
        trainer.run_training()
    return {
        "resumed_at_epoch": start,
        "uninterrupted": [lr for _, lr in uninterrupted if lr is not None],
        "resumed": [lr for _, _, lr in records if lr is not None],
        "uninterrupted_steps": [step for step, _ in uninterrupted],
        "resumed_steps": [step for _, step, _ in records],
    }


def load() -> dict:
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.checkpointer import SingleGPUCheckpointer

    draft, _, _, t2d = _draft("deepseek-v3-tiny")
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        opt = torch.optim.AdamW(draft.parameters())
        SingleGPUCheckpointer(tmp).save_checkpoint(draft, opt, 0, float_dtype=torch.float32)
        loaded = Eagle3DraftModel.from_pretrained(str(Path(tmp) / "0"), t2d=t2d, d2t=draft.d2t)
    mine, theirs = draft.state_dict(), loaded.state_dict()
    diffs = {k: float((mine[k].float() - theirs[k].float()).abs().max()) for k in mine if k in theirs}
    return {
        "max_weight_difference": max(diffs.values()),
        "differing": sorted(k for k, d in diffs.items() if d),
    }


if __name__ == "__main__":
    mode = sys.argv[1]
    try:
        result = {"ok": True, **globals()[mode]()}
    except Exception as exc:  # the symptom is the result
        traceback.print_exc()
        result = {"ok": False, "error_type": type(exc).__name__, "error": str(exc)[:2000]}
    print(json.dumps(result), flush=True)
