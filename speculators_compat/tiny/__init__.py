"""Tiny, randomly initialised checkpoints built offline from JSON recipes.

A recipe (``fixtures/recipes/<name>.json``) names an architecture and a shrunken config. The
builder turns it into a complete local checkpoint: ``config.json``, seeded random weights as
``model.safetensors``, a BPE tokenizer trained on the embedded chat corpus with a chat template,
and ``generation_config.json``. The result is cached under a folder whose name hashes the
recipe, the dtype and the builder version, so the same recipe always maps to the same files.

    >>> from speculators_compat.tiny import build
    >>> path = build("deepseek-v3-tiny", dtype="float32")
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from . import kimi
from .parts import ROLES, make_tokenizer, model_config, save_generation_config
from .train import model_of

__all__ = [
    "BUILDER_VERSION",
    "build",
    "build_recipe",
    "cache_root",
    "fixtures_dir",
    "list_recipes",
    "load_recipe",
    "sharp_attention",
    "sharpened",
]

#: Bump when the builder's output changes for an unchanged recipe (it is part of the cache key).
BUILDER_VERSION = 1


def fixtures_dir() -> Path:
    """The ``fixtures/`` folder: inside the installed wheel, or at the top of a source checkout."""
    packaged = Path(str(resources.files("speculators_compat"))) / "_fixtures"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "fixtures"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(
        "speculators_compat's fixtures are missing: neither the packaged copy "
        f"({packaged}) nor a source checkout's ({checkout}) exists; reinstall the package"
    )


def chat_dataset_path() -> Path:
    """The embedded chat dataset (JSONL, ShareGPT-shaped)."""
    return fixtures_dir() / "chat" / "tiny-chat.jsonl"


#: The embedded task conversations (:mod:`.tasks`): how many, and their seed, which neither the
#: trained fixtures' training rows (``train.seed``) nor their held-out rows (``seed + 1``) use.
TASKS_DATA = {"n": 300, "seed": 2}


def tasks_dataset_path() -> Path:
    """The embedded task dataset (JSONL, ShareGPT-shaped): prompts for the trained fixtures."""
    return fixtures_dir() / "chat" / "tiny-tasks.jsonl"


def list_recipes() -> list[str]:
    return sorted(p.stem for p in (fixtures_dir() / "recipes").glob("*.json"))


def load_recipe(name: str) -> dict:
    path = fixtures_dir() / "recipes" / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"no recipe named {name!r}; known recipes: {', '.join(list_recipes())}")
    recipe = json.loads(path.read_text())
    if recipe.get("name") != name:
        raise ValueError(f"{path}: 'name' is {recipe.get('name')!r}, expected {name!r}")
    return _expanded(recipe)


def _expanded(recipe: dict) -> dict:
    """A variant (``extends``): the recipe it names with the values it gives replaced (nested
    dicts merged)."""
    if "extends" not in recipe:
        return recipe
    changes = {key: value for key, value in recipe.items() if key != "extends"}
    return _merged(load_recipe(recipe["extends"]), changes)


def _merged(base: dict, changes: dict) -> dict:
    out = dict(base)
    for key, value in changes.items():
        out[key] = (
            _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def cache_root() -> Path:
    """Where built checkpoints live: ``$SPECULATORS_COMPAT_CACHE`` or ``~/.cache/speculators_compat``."""
    env = os.environ.get("SPECULATORS_COMPAT_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "speculators_compat"
    return base / "fixtures"


def sharp_attention(recipe: dict) -> bool:
    """A recipe (by name, or as a dict: a built fixture's ``recipe.json``) whose attention depends
    on positions, as a trained model's does: its text model is sharpened (``sharpen``) or trained
    (``train``). Its oracle comparisons hold the float32 bound for sharp weights
    (:data:`speculators_compat.oracle.reference.SHARP_TOLERANCE`)."""
    text = _base(recipe) if "base" in recipe else recipe
    return bool(text.get("sharpen") or "train" in text)


def sharpened(name: str) -> bool:
    """:func:`sharp_attention` of the shipped recipe ``name``."""
    return sharp_attention(load_recipe(name))


def _base(recipe: dict) -> dict:
    """A wrapper recipe's text-model recipe: named (a shipped recipe) or given inline."""
    base = recipe["base"]
    return _expanded(base) if isinstance(base, dict) else load_recipe(base)


def _resolved(recipe: dict) -> dict:
    """The recipe with its base recipe (for wrappers) inlined: what the cache key hashes."""
    if "base" in recipe:
        return {**recipe, "base": _resolved(_base(recipe))}
    return recipe


def _builder_source_digest() -> str:
    """Digest of this package's own code, so that a builder change never reuses stale files."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def cache_key(recipe: dict, dtype: str) -> str:
    """Hash of what decides the files: recipe, dtype, builder, and the torch and transformers
    releases (a tokenizer saved by transformers 5 does not load in 4.x, and torch's RNG may
    differ between releases)."""
    import torch
    import transformers

    blob = json.dumps(
        {
            "recipe": _resolved(recipe),
            "dtype": dtype,
            "builder": BUILDER_VERSION,
            "builder_source": _builder_source_digest(),
            "torch": torch.__version__.split("+")[0],
            "transformers": transformers.__version__,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build(name: str, dtype: str | None = None, *, out_dir: Path | None = None, force: bool = False) -> Path:
    """Build (or reuse from the cache) the checkpoint for recipe ``name``; return its folder."""
    return build_recipe(load_recipe(name), dtype, out_dir=out_dir, force=force)


def build_recipe(
    recipe: dict, dtype: str | None = None, *, out_dir: Path | None = None, force: bool = False
) -> Path:
    """:func:`build` for a recipe given as a dict (e.g. one derived from a real config)."""
    name = recipe["name"]
    dtype = dtype or recipe["dtypes"][0]
    if dtype not in recipe["dtypes"]:
        raise ValueError(f"recipe {name!r} offers dtypes {recipe['dtypes']}, not {dtype!r}")
    target = Path(out_dir) if out_dir else cache_root() / f"{name}-{dtype}-{cache_key(recipe, dtype)}"
    if (target / "config.json").is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp folder and rename it into place, so that a crash never leaves
    # a half-written checkpoint where the cache would find it.
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp.chmod(0o755)
    try:
        _materialise(recipe, dtype, tmp)
        if force or not (target / "config.json").is_file():
            shutil.rmtree(target, ignore_errors=True)
        try:
            tmp.rename(target)
        except OSError:
            # Another process (two tox envs, two preflights) built the same key meanwhile and may
            # be reading it already: keep theirs, the same bytes (the builder is deterministic).
            if not (target / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target


def _materialise(recipe: dict, dtype: str, out: Path) -> None:
    kind = recipe.get("kind", "causal-lm")
    if kind == "causal-lm":
        _build_causal_lm(recipe, dtype, out)
    elif kind == "kimi-k25":
        kimi.build_kimi_k25(recipe, _base(recipe), dtype, out)
    else:
        raise ValueError(f"recipe {recipe['name']!r}: unknown kind {kind!r}")
    (out / "recipe.json").write_text(json.dumps(_resolved(recipe), indent=2, sort_keys=True) + "\n")


def _build_causal_lm(recipe: dict, dtype: str, out: Path) -> None:
    import torch

    tokenizer = make_tokenizer(recipe)
    config = model_config(recipe, tokenizer, dtype)
    model = model_of(recipe, config, tokenizer, out)
    model.to(getattr(torch, dtype))
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    save_generation_config(config, out)


def load_chat(path: Path | None = None) -> list[dict]:
    """Rows of a chat JSONL file (default: the embedded dataset)."""
    path = Path(path) if path else chat_dataset_path()
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def sample_token_ids(model_dir: Path, n: int, start: int = 0) -> list[list[int]]:
    """Token ids of ``n`` embedded conversations, formatted with the checkpoint's chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=True)
    out = []
    for row in load_chat()[start : start + n]:
        messages = [{"role": ROLES[turn["from"]], "content": turn["value"]} for turn in row["conversations"]]
        out.append(list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)))
    return out
