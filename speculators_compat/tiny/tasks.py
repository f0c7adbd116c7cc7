"""Conversations whose answers follow from their questions: what the trained fixtures learn.

The embedded chat data (:mod:`.chat`) draws every word of an answer at random, so no model can
predict it and a verifier trained on it would be as undecided as a random one. Here each answer
is a function of its question, and finding it takes attention to the question, not the previous
token alone (a bigram predictor reaches what :func:`speculators_compat.tiny.train.metrics`
reports as ``bigram_agreement``):

- ``Tell me about S.``: the answer names S and recites S's own facts (a lookup keyed on S);
- ``Count from A to B.``: counts, so each number depends on the one before and on B;
- ``Repeat after me: W1 W2 W3.``: copies the words;
- ``How many words are in: W1 W2?``: counts the words, then copies them.

Deterministic: the same ``(n, seed)`` gives the same rows. ShareGPT-shaped like the chat data.
"""

from __future__ import annotations

import random

WORDS = [
    "apple", "river", "stone", "cloud", "tiger", "lamp", "garden", "window", "violin", "kettle",
    "harbour", "market", "candle", "forest", "bridge", "mirror", "pepper", "rocket", "island",
    "ladder", "copper", "meadow", "engine", "pillow", "silver", "thunder", "basket", "feather",
    "orange", "castle",
]  # fmt: skip
SUBJECTS = [
    "the river", "a small robot", "the old library", "the night train", "a paper boat",
    "the lighthouse", "an orange cat", "a jazz band", "the winter market", "a copper kettle",
    "the desert road", "a violin maker",
]  # fmt: skip
ADJECTIVES = [
    "bright", "quiet", "curious", "ancient", "gentle", "stormy", "tiny", "golden", "patient",
    "busy", "hidden", "cheerful",
]  # fmt: skip


def facts(subject: str) -> tuple[str, str, int]:
    """The subject's two adjectives and its number (fixed per subject)."""
    i = SUBJECTS.index(subject)
    return ADJECTIVES[i], ADJECTIVES[(i * 5 + 3) % len(ADJECTIVES)], 7 + 6 * i


def task(rng: random.Random) -> tuple[str, str]:
    """One (question, answer) pair."""
    kind = rng.randrange(4)
    if kind == 0:
        subject = rng.choice(SUBJECTS)
        first, second, number = facts(subject)
        return (
            f"Tell me about {subject}.",
            f"{subject[0].upper()}{subject[1:]} is {first} and {second}, and it waits {number} minutes.",
        )
    if kind == 1:
        start = rng.randint(1, 40)
        stop = start + rng.randint(3, 9)
        return f"Count from {start} to {stop}.", ", ".join(str(n) for n in range(start, stop + 1)) + "."
    words = [rng.choice(WORDS) for _ in range(rng.randint(2, 4))]
    if kind == 2:
        return f"Repeat after me: {' '.join(words)}.", f"{' '.join(words)}."
    return f"How many words are in: {' '.join(words)}?", f"There are {len(words)} words: {', '.join(words)}."


def make_conversations(n: int, seed: int) -> list[dict]:
    """``n`` one-turn conversations."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        question, answer = task(rng)
        turns = [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
        rows.append({"id": f"tasks-{seed}-{i:04d}", "conversations": turns})
    return rows
