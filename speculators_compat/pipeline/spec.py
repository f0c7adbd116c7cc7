"""What a run is, and how one command runs it.

:class:`RunSpec` is a run's identity: the settings a run folder's ``run.json`` holds, written
once by :meth:`RunFolder.claim <speculators_compat.pipeline.layout.RunFolder.claim>` (which
refuses a folder holding another run) and read back typed by every stage (``RunFolder.spec()``).
:class:`RunOptions` is what may change from one command to the next (batch size, tensor
parallelism, the shard, loader workers, progress bars, training's options): never written as
the run's identity. :class:`RunRequest` is what one command line asks for: the identity values
it gives and its options.

This module imports nothing heavy (no torch, datasets or vLLM): the CLI builds these before any
stage runs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import PipelineError


@dataclass(frozen=True)
class RunSpec:
    """A run's identity. A folder holding other values holds a different run."""

    model: str
    data: str | None = None
    seq_length: int = 2048
    max_samples: int | None = None
    seed: int = 0
    #: Regenerate the assistant turns with the verifier, at most this many tokens each (None: off).
    regenerate: int | None = None
    #: The verifier layers whose states are captured (None: speculators' default for the depth).
    layer_ids: tuple[int, ...] | None = None
    draft_vocab_size: int | None = None
    #: What the verifier runs in, extracting and serving ("auto": vLLM's choice for the checkpoint).
    #: None until ``--dtype`` is given or extraction starts (which records what it runs in).
    dtype: str | None = None

    @classmethod
    def from_settings(cls, settings: dict, root: Path) -> RunSpec:
        """The spec ``run.json`` holds (keys that are not identity are ignored)."""
        if not settings.get("model"):
            raise PipelineError(
                f"{root} has no run yet: start with `speculators-compat prepare --model M --data D "
                f"--out {root}` (or `run`)."
            )
        values = {k: settings[k] for k in IDENTITY if settings.get(k) is not None}
        if "layer_ids" in values:
            values["layer_ids"] = tuple(values["layer_ids"])
        return cls(**values)

    def settings(self) -> dict:
        """As ``run.json`` holds it (JSON types)."""
        values = dataclasses.asdict(self)
        if self.layer_ids is not None:
            values["layer_ids"] = list(self.layer_ids)
        return values


#: The identity's keys in ``run.json``, from :class:`RunSpec`.
IDENTITY: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RunSpec))


#: ``train --precision``: fp32, speculators 0.3.0 as it ships (on a GPU every matmul at the fp32
#: ceiling); tf32, float32 weights and activations with TensorFloat-32 matmuls (a CUDA GPU's
#: tensor cores, set before speculators compiles the draft); bf16, the draft's forward and
#: backward under bfloat16 autocast, its weights and optimizer in float32 (the shim
#: ``draft_attention_autocast_dtype`` lets its attention run so). The default: tf32 on a CUDA
#: GPU, fp32 on a CPU (TF32 is a GPU format). docs/performance.md has the measured speeds and losses.
PRECISIONS = ("fp32", "tf32", "bf16")

#: speculators 0.3.0's metric loggers (``speculators.train.logger``), each with the package it
#: needs (the extra of the same name installs it).
METRIC_LOGGERS = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


def metric_logger_names(value: str | tuple[str, ...]) -> tuple[str, ...]:
    """``--log-to tensorboard,wandb`` (or the names) -> the logger names, each known, each once."""
    parts = value.split(",") if isinstance(value, str) else value
    names = tuple(dict.fromkeys(n.strip() for n in parts if n.strip()))
    unknown = [n for n in names if n not in METRIC_LOGGERS]
    if unknown:
        raise PipelineError(f"--log-to {','.join(unknown)}: choose from {', '.join(METRIC_LOGGERS)}.")
    return names


def check_metric_loggers(names: tuple[str, ...]) -> None:
    """Refuse ``--log-to`` loggers unknown or whose package is not installed, before any stage
    runs (not when training starts, hours into a run)."""
    missing = [n for n in metric_logger_names(names) if importlib.util.find_spec(METRIC_LOGGERS[n]) is None]
    if missing:
        packages = " ".join(METRIC_LOGGERS[n] for n in missing)
        raise PipelineError(
            f"--log-to {','.join(missing)}: the {packages} package is not installed here. Install it "
            f"(pip install 'speculators-compat[{','.join(missing)}]') and run the command again, or "
            f"leave --log-to out: train_metrics.jsonl records every step either way."
        )


@dataclass(frozen=True)
class TrainOptions:
    epochs: int = 3
    lr: float = 1e-4
    num_layers: int = 1
    ttt_steps: int = 3
    ttt_step_loss_decay: float = 1.0
    total_seq_len: int = 8192
    #: Data loader workers; None: ``train.loader_workers`` (on a GPU, loading runs beside the step).
    num_workers: int | None = None
    noise_std: float = 0.05
    val_ratio: float = 0.9
    #: What the draft's float32 matmuls run in (:data:`PRECISIONS`); None: the device's default.
    precision: str | None = None
    #: speculators' metric loggers the training metrics also go to (:data:`METRIC_LOGGERS`).
    log_to: tuple[str, ...] = ()


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count``: the samples ``i`` with ``i % count == index``."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not m or not int(m.group(1)) < int(m.group(2)):
            raise ValueError(
                f"{text!r}: give the shard as I/N with 0 <= I < N, e.g. 0/4 ... 3/4 for four machines"
            )
        return cls(int(m.group(1)), int(m.group(2)))

    def owns(self, i: int) -> bool:
        return i % self.count == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


WHOLE = Shard()


@dataclass(frozen=True)
class RunOptions:
    """One command's knobs: they may differ between the commands of one run."""

    batch_size: int = 8
    tensor_parallel_size: int = 1
    num_proc: int = 1
    #: extract only this shard (``extract --shard I/N``).
    shard: Shard = WHOLE
    progress: bool = True
    train: TrainOptions = field(default_factory=TrainOptions)


@dataclass(frozen=True)
class RunRequest:
    """What one command line asks for: the identity values it gives, and its options.

    ``seq_length`` and ``seed`` are part of the request only with ``model`` (the command that
    names the verifier defines the run; a later ``train --out RUN`` does not restate them).
    Paths are made absolute."""

    identity: dict[str, Any] = field(default_factory=dict)
    options: RunOptions = field(default_factory=RunOptions)

    @classmethod
    def of(cls, options: RunOptions | None = None, **values) -> RunRequest:
        unknown = set(values) - set(IDENTITY)
        if unknown:
            raise TypeError(f"not identity settings: {sorted(unknown)}")
        if not values.get("model"):
            values.pop("seq_length", None)
            values.pop("seed", None)
        for k in ("model", "data"):
            if values.get(k):
                values[k] = str(Path(values[k]).expanduser().resolve())
        if values.get("layer_ids") is not None:
            values["layer_ids"] = list(values["layer_ids"])
        if values.get("dtype") == "auto":
            values["dtype"] = None  # vLLM's choice: what any run accepts until extraction records one
        given = {k: v for k, v in values.items() if v is not None}
        return cls(given, options or RunOptions())

    def __getattr__(self, name: str):  # request.model, request.dtype ...: None where not given
        if name in IDENTITY:
            return self.identity.get(name)
        raise AttributeError(name)
