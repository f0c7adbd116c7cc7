"""A small synthetic chat dataset, generated offline and deterministically.

The conversations are ShareGPT-shaped (``{"conversations": [{"from": "human", "value": ...}]}``),
the format speculators 0.3.0's preprocessing reads from a local JSON/JSONL file. They are
made from word lists with a seeded RNG, so the same seed gives the same file byte for byte.

Regenerate the shipped copy with ``speculators-compat fixtures chat``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

_SUBJECTS = [
    "the river",
    "a small robot",
    "the old library",
    "my neighbour's garden",
    "the night train",
    "a paper boat",
    "the mountain village",
    "an orange cat",
    "the lighthouse",
    "a jazz band",
    "the bakery on the corner",
    "a lost umbrella",
    "the school choir",
    "a quiet harbour",
    "the winter market",
    "a copper kettle",
    "the desert road",
    "a violin maker",
]
_VERBS = [
    "explain",
    "describe",
    "summarise",
    "compare",
    "imagine",
    "list three facts about",
    "write a short poem about",
    "give advice on",
    "tell a story about",
    "plan a day around",
]
_ADJECTIVES = [
    "bright",
    "quiet",
    "curious",
    "ancient",
    "gentle",
    "stormy",
    "tiny",
    "golden",
    "patient",
    "busy",
    "hidden",
    "cheerful",
    "distant",
    "careful",
    "warm",
    "clever",
]
_CONNECTORS = ["Also,", "Then", "After that,", "Meanwhile,", "Finally,", "In short,", "Still,"]
_SYSTEM = [
    "You are a helpful assistant.",
    "You are a concise assistant who answers in plain words.",
    "You are Kimi, an assistant that likes short stories.",
]
_FOLLOW_UPS = [
    "Can you make it shorter?",
    "Why is that?",
    "Add one more detail.",
    "What would change at night?",
    "Say it like a sailor would.",
    "Give me a number for it.",
]


def _sentence(rng: random.Random) -> str:
    return (
        f"{rng.choice(_CONNECTORS)} {rng.choice(_SUBJECTS)} is {rng.choice(_ADJECTIVES)} "
        f"and {rng.choice(_ADJECTIVES)}, so {rng.choice(_SUBJECTS)} waits {rng.randint(2, 99)} "
        f"minutes."
    )


def _answer(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randint(1, 6)))


def make_conversations(n: int = 300, seed: int = 0) -> list[dict]:
    """Return ``n`` multi-turn conversations (1-4 user turns, some with a system prompt)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        turns: list[dict] = []
        if rng.random() < 0.3:
            turns.append({"from": "system", "value": rng.choice(_SYSTEM)})
        turns.append({"from": "human", "value": f"Please {rng.choice(_VERBS)} {rng.choice(_SUBJECTS)}."})
        turns.append({"from": "gpt", "value": _answer(rng)})
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            turns.append({"from": "human", "value": rng.choice(_FOLLOW_UPS)})
            turns.append({"from": "gpt", "value": _answer(rng)})
        rows.append({"id": f"tiny-{seed}-{i:04d}", "conversations": turns})
    return rows


def write_jsonl(rows: list[dict], path: Path) -> Path:
    """Write rows as JSONL through a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def corpus_text(rows: list[dict]) -> list[str]:
    """Every message of every conversation: the tokenizer's training text."""
    return [turn["value"] for row in rows for turn in row["conversations"]]
