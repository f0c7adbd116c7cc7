"""Settings the shims and the tooling share, each chosen in one place and read by both.

- The extraction dtype: ``with extraction_dtype("float32"):`` (what ``extract`` and ``smoke``
  use), else ``SPECULATORS_COMPAT_DTYPE``, else vLLM's "auto"; the shim ``generator_dtype``
  hands :func:`chosen_dtype` to speculators' generator.
- :data:`MODALITIES`: the modality names a text-only engine turns off (the shim
  ``multimodal_text_only`` for extraction, ``serve-check`` and the oracle's probe for theirs).

Core: imports nothing of the package.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

#: The exported variable that chooses the extraction dtype (float32, bfloat16, float16).
DTYPE_ENV = "SPECULATORS_COMPAT_DTYPE"

#: Every modality name vLLM's models register (Kimi-K2.5 uses "vision_chunk").
MODALITIES = ("image", "video", "audio", "vision_chunk")

_chosen: list[str] = []


@contextmanager
def extraction_dtype(dtype: str | None) -> Iterator[None]:
    """Generators created inside run in ``dtype`` (None: the exported variable, else "auto")."""
    _chosen.append(dtype or "")
    try:
        yield
    finally:
        _chosen.pop()


def chosen_dtype() -> str:
    """The dtype a generator created now runs in: the innermost :func:`extraction_dtype`, else
    ``SPECULATORS_COMPAT_DTYPE``, else vLLM's "auto"."""
    inner = next((d for d in reversed(_chosen) if d), None)
    return inner or os.environ.get(DTYPE_ENV) or "auto"
