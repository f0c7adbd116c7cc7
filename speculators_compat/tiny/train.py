"""Training a fixture briefly on CPU, so that its choices can be learned (a recipe's ``train``).

A random verifier's greedy choices are near-ties (top-1/top-2 logit margin about 0.06 on the
random fixtures): no draft can learn them, so acceptance cannot tell a right pipeline from a
broken one, and its attention is uniform, so position bugs hide. A recipe with a ``train``
section is trained here on :mod:`.tasks` conversations, formatted with the fixture's own chat
template, deterministically on one machine (seeded initialisation and batches, no dropout; CPU
kernels differ between CPUs and torch releases, so another machine lands nearby, not on the same
bits). Training takes about 2 minutes on 2 cores, so its result is committed
(``fixtures/weights``, :func:`load_trained`) and ``speculators-compat fixtures train`` remakes it:

    "train": {"conversations": 4000, "held_out": 200, "seed": 0, "steps": 500,
              "batch_size": 32, "lr": 0.01}

:func:`metrics` measures the result on held-out conversations, on the answer tokens (what a
verifier generates when serving): mean top-1 probability, the top-1/top-2 margin's quantiles,
greedy agreement with the text, and what a bigram predictor (counted on the training tokens)
reaches on the same tokens. The builder writes them to the fixture's ``training.json``.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from . import tasks
from .parts import ROLES, make_tokenizer, model_config, random_model

#: What a trained fixture's folder says about its training (:func:`train`'s facts).
TRAINING_FILE = "training.json"


def model_of(recipe: dict, config, tokenizer, out: Path):
    """The float32 model a text-model recipe builds: its committed trained weights (their facts
    written to ``out``) where it has a ``train`` section, else seeded random weights."""
    if "train" not in recipe:
        return random_model(config, recipe.get("seed", 0), recipe.get("sharpen"))
    model, facts = load_trained(config, tokenizer, recipe["name"])
    (Path(out) / TRAINING_FILE).write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
    return model


def weights_path(name: str) -> Path:
    """Where a trained recipe's committed weights are: ``fixtures/weights/<name>.safetensors``,
    beside ``<name>.json`` (:func:`train`'s facts and the tokenizer they index)."""
    from . import fixtures_dir  # deferred: the package's __init__ imports this module

    return fixtures_dir() / "weights" / f"{name}.safetensors"


def tokenizer_digest(tokenizer) -> str:
    """What the weights depend on: the tokenizer's vocabulary (ids of every token)."""
    blob = json.dumps(tokenizer.get_vocab(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def load_trained(config, tokenizer, name: str):
    """Recipe ``name``'s model (``config``) with its committed weights, and their facts. Training
    takes about 2 minutes on 2 cores, so the weights it made are committed and only loaded here;
    ``speculators-compat fixtures train NAME`` makes them again (tests/test_fixtures.py checks
    that doing so reaches the committed figures)."""
    import torch
    from transformers import AutoModelForCausalLM

    path = weights_path(name)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `speculators-compat fixtures train {name}`")
    facts = json.loads(path.with_suffix(".json").read_text())
    if facts["tokenizer"] != tokenizer_digest(tokenizer):
        raise RuntimeError(
            f"{path} was trained with another tokenizer ({facts['tokenizer']}; this build's: "
            f"{tokenizer_digest(tokenizer)}): the token ids it learned mean other tokens here. "
            f"Run `speculators-compat fixtures train {name}` with this tokenizers release."
        )
    # through from_pretrained, which converts the checkpoint layout to the installed
    # transformers' own (transformers 5 fuses the experts)
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        shutil.copyfile(path, Path(tmp) / "model.safetensors")
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
    return model.eval(), facts


def _messages(row: dict) -> list[dict]:
    return [{"role": ROLES[turn["from"]], "content": turn["value"]} for turn in row["conversations"]]


def encode(tokenizer, row: dict) -> tuple[list[int], int]:
    """A one-turn conversation's token ids, and where its answer starts."""
    messages = _messages(row)
    full = list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False))
    prompt = tokenizer.apply_chat_template(
        messages[:-1], tokenize=True, add_generation_prompt=True, return_dict=False
    )
    return full, len(prompt)


def train(model, tokenizer, spec: dict) -> dict:
    """Train ``model`` (float32, in place) as ``spec`` says; return :func:`metrics` and timings."""
    import torch

    seed = spec.get("seed", 0)
    rows = tasks.make_conversations(spec["conversations"], seed)
    held = tasks.make_conversations(spec["held_out"], seed + 1)
    sequences = [encode(tokenizer, row)[0] for row in rows]
    torch.manual_seed(seed)
    batches = random.Random(seed)
    steps, size = spec["steps"], spec["batch_size"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=spec["lr"], total_steps=steps, pct_start=0.1
    )
    pad = tokenizer.pad_token_id
    model.train()
    t0 = time.perf_counter()
    losses = []
    for _ in range(steps):
        batch = batches.sample(sequences, size)
        width = max(map(len, batch))
        ids = torch.full((size, width), pad)
        labels = torch.full((size, width), -100)
        for i, seq in enumerate(batch):
            ids[i, : len(seq)] = labels[i, : len(seq)] = torch.tensor(seq)
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    seconds = time.perf_counter() - t0
    return {
        **metrics(model, tokenizer, sequences, [encode(tokenizer, row) for row in held]),
        "first_loss": round(losses[0], 4),
        "last_loss": round(losses[-1], 4),
        "train_seconds": round(seconds, 1),
        "spec": spec,
        "tokenizer": tokenizer_digest(tokenizer),
    }


def metrics(model, tokenizer, training: list[list[int]], held: list[tuple[list[int], int]]) -> dict:
    """The model and a bigram predictor on ``held``'s answer tokens (see the module doc)."""
    import torch

    follows: dict[int, Counter] = defaultdict(Counter)
    for seq in training:
        for a, b in zip(seq, seq[1:], strict=False):
            follows[a][b] += 1
    bigram = {a: max(counts.items(), key=lambda kv: (kv[1], -kv[0]))[0] for a, counts in follows.items()}
    top1, margins, agree, bigram_agree = [], [], [], []
    with torch.no_grad():
        for ids, start in held:
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
            for j in range(start - 1, len(ids) - 1):
                top = logits[j].topk(2)
                top1.append(float(logits[j].softmax(-1)[top.indices[0]]))
                margins.append(float(top.values[0] - top.values[1]))
                agree.append(int(top.indices[0]) == ids[j + 1])
                bigram_agree.append(bigram.get(ids[j]) == ids[j + 1])
    ranked = sorted(margins)

    def quantile(q: float) -> float:
        return round(ranked[min(int(q * len(ranked)), len(ranked) - 1)], 3)

    return {
        "answer_tokens": len(top1),
        "top1_probability": round(sum(top1) / len(top1), 4),
        "margin_quantiles": {f"p{int(q * 100)}": quantile(q) for q in (0.05, 0.1, 0.25, 0.5, 0.9)},
        "margin_below_0.1": round(sum(m < 0.1 for m in margins) / len(margins), 4),
        "greedy_agreement": round(sum(agree) / len(agree), 4),
        "bigram_agreement": round(sum(bigram_agree) / len(bigram_agree), 4),
    }


def make_trained(name: str, out_dir: Path | None = None) -> tuple[Path, dict]:
    """Train recipe ``name`` from its ``train`` section and write its weights (float32) and facts
    to ``out_dir`` (default: where :func:`load_trained` reads them)."""
    from . import load_recipe  # deferred: the package's __init__ imports this module

    recipe = load_recipe(name)
    if "train" not in recipe:
        raise ValueError(f"recipe {name!r} has no 'train' section")
    tokenizer = make_tokenizer(recipe)
    model = random_model(
        model_config(recipe, tokenizer, "float32"), recipe.get("seed", 0), recipe.get("sharpen")
    )
    facts = train(model, tokenizer, recipe["train"])
    path = Path(out_dir) / f"{name}.safetensors" if out_dir else weights_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)  # the checkpoint layout
        shutil.copyfile(Path(tmp) / "model.safetensors", path)
    path.with_suffix(".json").write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
    return path, facts
