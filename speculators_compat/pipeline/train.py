"""train: the EAGLE-3 draft through speculators 0.3.0's model, data loader and trainer.

Single process, or one process per rank under ``torchrun`` (speculators' distributed path:
FSDP2 ``fully_shard`` and its ``DistributedCheckpointer``). Checkpoints go to
``checkpoints/<epoch>/`` and resume from the last complete epoch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..text_model import text_config
from .atomic import disk_full, free_bytes, gib
from .errors import PipelineError
from .layout import RunFolder
from .model_info import ModelInfo
from .samples import sample_index, vllm_aux_layer_ids
from .spec import PRECISIONS, RunSpec, TrainOptions

log = logging.getLogger("speculators_compat.pipeline")


#: Data loader workers on a CUDA GPU by default (each reads, casts and adds noise to whole batches:
#: 1.5 s a batch of 8,192 Kimi-K2.5 tokens on one CPU core against 0.8 s of GPU work; docs/performance.md).
GPU_LOADER_WORKERS = 4


def loader_workers(requested: int | None, device_type: str) -> int:
    """Data loader workers for ``--num-workers requested`` on ``device_type``: on a CPU the
    training process loads (workers would take the cores the step needs), on a GPU
    :data:`GPU_LOADER_WORKERS`, at most the CPUs this process may use less one."""
    if requested is not None:
        return requested
    if device_type != "cuda":
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(0, min(GPU_LOADER_WORKERS, cpus - 1))


def chosen_precision(requested: str | None, device_type: str) -> str:
    """The precision training runs in on ``device_type`` for ``--precision requested``."""
    if requested is not None and requested not in PRECISIONS:
        raise PipelineError(f"--precision {requested!r}: choose one of {', '.join(PRECISIONS)}.")
    if device_type != "cuda":
        if requested == "tf32":
            log.warning("--precision tf32 applies to CUDA GPUs; training on the %s in fp32", device_type)
        return "bf16" if requested == "bf16" else "fp32"
    return requested or "tf32"


def precision_context(precision: str, device_type: str):
    """A context in which training runs in ``precision``: float32 matmuls in TF32 for tf32 and
    bf16 (torch's global setting, restored when it ends: only this training changes, not the rest
    of the process), and bfloat16 autocast on ``device_type`` for bf16.

    Autocast without its cast cache: autocast keeps the bfloat16 copy of each float32 weight it
    casts until its outermost context exits, so with the cache one context around the training
    computes every step with the first step's weights (on a CPU the loss did not move in 36 steps
    where fp32's fell 11%: benchmarks/results/gpu_train-bf16-h100-2026-12-07.json;
    tests/test_precision.py). One context stays around the whole training, the backward too:
    with autocast around each forward only, the draft's flex attention backward on a CPU with
    torch 2.8 met a float32 gradient with bfloat16 scores (``expected m1 and m2 to have the same
    dtype``)."""
    import torch

    @contextlib.contextmanager
    def context():
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest" if precision == "fp32" else "high")
        try:
            with torch.autocast(
                device_type, dtype=torch.bfloat16, enabled=precision == "bf16", cache_enabled=False
            ):
                yield
        finally:
            torch.set_float32_matmul_precision(before)

    return context()


def use_fused_adamw(optimizer, fused: bool) -> None:
    """Switch speculators' ``torch.optim.AdamW`` (built and, on a resume, loaded by
    ``Trainer.setup_optimizer``) to torch's fused kernels (one kernel for every parameter's update
    instead of the foreach kernels' several passes) or back, before its first step. The kernel is
    chosen per parameter group at each step; its step counters live on the parameters' device
    (fused) or the CPU (foreach), as torch places them, whatever kind of run saved the state.
    The same math in float32: a fused run's weights differ from a foreach run's by rounding."""
    import torch

    for group in optimizer.param_groups:
        group["fused"], group["foreach"] = (True, False) if fused else (False, None)
        for param in group["params"]:
            state = optimizer.state.get(param)
            if state and torch.is_tensor(state.get("step")):
                state["step"] = state["step"].to(dtype=torch.float32, device=param.device if fused else "cpu")


def fused_adamw_for(precision: str) -> bool:
    """Whether training in ``precision`` updates with fused AdamW: tf32 and bf16; fp32 keeps
    speculators' foreach kernels (and its numbers) exactly."""
    return precision != "fp32"


@contextlib.contextmanager
def metric_loggers(run: RunFolder, names: tuple[str, ...], rank: int):
    """speculators 0.3.0's own metric handlers for ``names`` on its ``speculators.metrics``
    logger while training runs, on rank 0 (the other ranks' metrics are reduced to it); removed
    and closed (event files flushed) when it ends. Each logs under the run folder's name, files in
    ``RUN/logs/`` (TensorBoard: ``RUN/logs/<run>/``). Set up here rather than with speculators'
    ``setup_metric_logger``, whose ``logging.config.dictConfig`` closes every handler the process
    has."""
    if not names or rank != 0:
        yield
        return
    from speculators.train.logger import IsMappingFilter, TensorBoardHandler, TrackioHandler, WandbHandler

    kinds = {"tensorboard": TensorBoardHandler, "wandb": WandbHandler, "trackio": TrackioHandler}
    metrics = logging.getLogger("speculators.metrics")
    handlers = []
    for name in names:
        handler = kinds[name](run_name=run.root.name, log_dir=run.logs)
        handler.addFilter(IsMappingFilter())
        handlers.append(handler)
        metrics.addHandler(handler)
    try:
        yield
    finally:
        for handler in handlers:
            metrics.removeHandler(handler)
            handler.close()


@dataclass
class TrainResult:
    checkpoint: str
    epochs: int
    steps: int
    first_loss: float | None
    last_loss: float | None
    losses: list[float] = field(default_factory=list)
    #: What the float32 matmuls ran in (:data:`PRECISIONS`).
    precision: str = "fp32"
    #: Samples training held out (``serve-check`` prompts with them).
    validation_samples: list[int] = field(default_factory=list)
    #: Data loader workers (:func:`loader_workers`).
    loader_workers: int = 0
    #: Whether AdamW ran torch's fused kernels (:func:`fused_adamw_for`).
    fused_adamw: bool = False


def _sample_dataset_class():
    """speculators' ``Eagle3SampleFileDataset`` whose unreadable sample stops training with its
    file named (what to do included), not the loader's traceback; module-level, so that loader
    workers started by spawn can unpickle it."""
    global SampleFileDataset
    if "SampleFileDataset" in globals():
        return SampleFileDataset
    from speculators.train.data import Eagle3SampleFileDataset

    class SampleFileDataset(Eagle3SampleFileDataset):
        def __getitem__(self, index):
            try:
                return super().__getitem__(index)
            except Exception as exc:  # noqa: BLE001 (torch.load's errors have no common type)
                path = Path(self.data[index])
                raise PipelineError(
                    f"{path} cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0]}): "
                    f"run `speculators-compat extract --out {path.parents[1]}` to extract it again, "
                    "then train again (training resumes from the last complete epoch)."
                ) from exc

    SampleFileDataset.__module__ = __name__
    return SampleFileDataset


class _MetricsFile(logging.Handler):
    """Receives speculators' metric records (dicts on ``speculators.metrics``) on rank 0."""

    def __init__(self, path: Path, bar, precision: str):
        super().__init__(logging.INFO)
        self.path, self.bar, self.losses, self.precision = path, bar, [], precision

    def emit(self, record):
        if not isinstance(record.msg, dict):
            return
        # time: when the step's metrics were read (after its loss synchronised the device)
        entry = {
            "step": getattr(record, "step", None),
            "time": round(record.created, 3),
            "precision": self.precision,
            **record.msg,
        }
        with self.path.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        train = record.msg.get("train")
        if isinstance(train, dict) and "loss" in train:
            self.losses.append(float(train["loss"]))
            if self.bar is not None:
                self.bar.update(1)
                self.bar.set_postfix(loss=f"{train['loss']:.4f}")


#: torch.compile variants of one draft frame that training needs (measured on an H100, Kimi-K2.5
#: sizes: dynamo's default of 8 is spent inside the first steps).
DRAFT_RECOMPILE_LIMIT = 64


def draft_compile_limits():
    """A context in which dynamo may compile the draft's frames often enough for training.

    On GPUs speculators compiles ``Eagle3DraftModel.forward``. Each decoder layer call is a frame
    of its own whose guards change with the test-time-training step (the layer's KV cache is a
    strided view at step 0, a concatenation after), with grad mode (validation) and with how many
    samples a batch packs. Past dynamo's ``recompile_limit`` (8) the frame runs eagerly:
    ``torch._dynamo hit config.recompile_limit (8) ... function: '__call__'
    (transformers/modeling_layers.py)``, and flex attention, no longer compiled, materialises the
    whole score matrix (heads x tokens x 3*tokens floats): ``CUDA out of memory`` at 4,096 tokens
    on an 80 GB H100 for the Kimi-K2.5-sized draft. The limit is raised for training only; on CPU
    (the draft runs eagerly there) this changes nothing."""
    import torch._dynamo

    config = torch._dynamo.config  # recompile_limit: torch >= 2.6 (the oldest tested is 2.8)
    if config.recompile_limit >= DRAFT_RECOMPILE_LIMIT:
        return contextlib.nullcontext()
    return config.patch(recompile_limit=DRAFT_RECOMPILE_LIMIT)


def out_of_memory_advice(run: RunFolder, total_seq_len: int, exc: BaseException) -> str:
    """What to do when a training step does not fit the GPU: the batch (``--total-seq-len``
    tokens, packed) decides the activations; the allocator's fragmentation decides the last
    tenth. Measured on one 80 GB H100, Kimi-K2.5-sized draft (docs/performance.md, Training on one GPU):
    16,384 tokens fit, 20,480 only with expandable segments."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    saved = (
        sorted(int(p.name) for p in run.checkpoints.iterdir() if p.name.isdigit())
        if run.checkpoints.is_dir()
        else []
    )
    resume = (
        f"train resumes from {run.checkpoints / str(saved[-1])} (the last finished epoch)"
        if saved
        else "no epoch had finished, so train starts again from the first step"
    )
    return (
        f"the GPU ran out of memory training with --total-seq-len {total_seq_len} ({first}). "
        f"Run train again with a smaller --total-seq-len (tokens per packed batch; half is safe), "
        f"or, where the message reports memory 'reserved by PyTorch but unallocated', with "
        f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True exported. Nothing written was removed: "
        f"{resume}."
    )


def transformer_layer_config(info: ModelInfo, num_layers: int):
    """A Llama decoder layer config in the verifier's sizes (speculators' draft layer type)."""
    from transformers import AutoConfig, LlamaConfig

    verifier = AutoConfig.from_pretrained(str(info.path), trust_remote_code=True)
    verifier = text_config(verifier)
    heads = verifier.num_attention_heads
    config = LlamaConfig(
        vocab_size=verifier.vocab_size,
        hidden_size=verifier.hidden_size,
        intermediate_size=verifier.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(verifier, "num_key_value_heads", None) or heads,
        hidden_act=getattr(verifier, "hidden_act", "silu"),
        max_position_embeddings=verifier.max_position_embeddings,
        initializer_range=getattr(verifier, "initializer_range", 0.02),
        rms_norm_eps=verifier.rms_norm_eps,
        # The draft layer is a plain Llama layer: its head size follows from its own sizes (a
        # DeepSeek verifier's head_dim describes MLA, not this layer).
        head_dim=verifier.hidden_size // heads,
    )
    config._attn_implementation = "simple_flex_attention"
    return config, verifier


def train(
    run: RunFolder, spec: RunSpec, info: ModelInfo, options: TrainOptions, *, progress: bool = True
) -> TrainResult:
    import numpy as np
    import torch
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from speculators.train.data import (
        create_collate_fn,
        split_files,
        standardize_data_v1,
    )
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
    from speculators.train.noise_transforms import AddUniformNoise
    from speculators.train.trainer import Trainer, TrainerConfig
    from speculators.train.utils import maybe_destroy_distributed, maybe_setup_distributed
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    run.require_all_samples("train")
    run.require("vocab", "train")
    local_rank, world_size, rank, distributed = maybe_setup_distributed()
    device = torch.device(local_rank) if torch.cuda.is_available() else torch.device("cpu")
    precision = chosen_precision(options.precision, device.type)
    workers = loader_workers(options.num_workers, device.type)
    # The run's seed decides the draft's initial weights and the training noise (both drawn on
    # the CPU): the same run folder trains the same draft on a CPU and on a GPU, up to numerics,
    # with --num-workers 0 --precision fp32. (Loader workers, a GPU's default, draw the noise in
    # their own processes, seeded from this seed: runs repeat, but their noise is not the CPU's.)
    torch.manual_seed(spec.seed)
    d2t = torch.from_numpy(np.load(run.vocab / "d2t.npy")).to(device)
    t2d = torch.from_numpy(np.load(run.vocab / "t2d.npy")).to(device)
    layer_config, verifier = transformer_layer_config(info, options.num_layers)

    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config,
        draft_vocab_size=int(d2t.shape[0]),
        norm_before_residual=True,
        # Which verifier states vLLM feeds the served draft, in vLLM's convention (the state
        # entering layer k): without it vLLM picks its own default layers.
        eagle_aux_hidden_state_layer_ids=vllm_aux_layer_ids(run.captured_layer_ids()),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[
                GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=options.ttt_steps)
            ],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(info.path), architectures=list(info.architectures)),
        ),
    )
    draft = Eagle3DraftModel(config=config, t2d=t2d, d2t=d2t)

    train_files, val_files = split_files(str(run.hidden_states), ratio=options.val_ratio)
    if not train_files:
        train_files, val_files = val_files, []
    if not train_files:
        raise PipelineError(f"{run.hidden_states} holds no data files; run extract first.")

    def loader(files, noise: bool):
        dataset = _sample_dataset_class()(
            file_list=files,
            max_len=options.total_seq_len,
            standardize_fn=standardize_data_v1,
            transform=AddUniformNoise(
                std=options.noise_std, tensors=("hidden_states", "verifier_last_hidden_states")
            )
            if noise and options.noise_std > 0
            else None,
        )
        sampler = MultipackDistributedBatchSamplerV2(
            batch_max_length=options.total_seq_len,
            lengths=dataset.approx_lengths,
            num_replicas=world_size,
            rank=rank,
        )
        return DataLoader(
            dataset,
            batch_sampler=sampler,
            num_workers=workers,
            # Page-locked batches: the trainer's non_blocking copies to the GPU are asynchronous.
            pin_memory=device.type == "cuda",
            collate_fn=create_collate_fn(options.total_seq_len),
        )

    train_loader = loader(train_files, noise=True)
    val_loader = loader(val_files, noise=False) if val_files else None
    call = {
        "use_off_policy_tokens": False,
        "ttt_steps": options.ttt_steps,
        "ttt_step_loss_decay": options.ttt_step_loss_decay,
    }
    trainer = Trainer(
        draft,
        TrainerConfig(
            lr=options.lr,
            num_epochs=options.epochs,
            save_path=str(run.checkpoints),
            resume_from_checkpoint=True,
            is_distributed=distributed,
            # speculators places the model and batches with .to(local_rank): an index is a CUDA
            # device, so on CPU the device itself is passed.
            local_rank=local_rank if device.type == "cuda" else device,
            train_call_kwargs=call,
            val_call_kwargs=call,
        ),
        train_loader,
        val_loader,
    )
    fused = fused_adamw_for(precision)
    use_fused_adamw(trainer.opt, fused)
    remaining = max(options.epochs - trainer.current_epoch, 0) * len(train_loader)
    bar = tqdm(
        total=remaining,
        desc="Training draft",
        unit="step",
        disable=not progress or rank != 0 or device.type == "cuda",
    )  # GPU: speculators' own bar
    metrics = logging.getLogger("speculators.metrics")
    handler = _MetricsFile(run.metrics, bar, precision)
    metrics.setLevel(logging.INFO)
    propagate = metrics.propagate
    metrics.propagate = False  # one line per step goes to train_metrics.jsonl, not the console
    if rank == 0:
        metrics.addHandler(handler)
    try:
        with (
            draft_compile_limits(),
            precision_context(precision, device.type),
            metric_loggers(run, options.log_to, rank),
        ):
            trainer.run_training()
    except torch.OutOfMemoryError as exc:
        raise PipelineError(out_of_memory_advice(run, options.total_seq_len, exc)) from exc
    except (OSError, RuntimeError) as exc:  # speculators' checkpointer writes on its own
        if not disk_full(exc, run.checkpoints):
            raise
        raise PipelineError(
            f"the disk holding {run.checkpoints} is full ({gib(free_bytes(run.checkpoints))} free) "
            f"while training ({type(exc).__name__}: {str(exc).splitlines()[0]}). Free space (or move "
            "the run folder), then run the same command again: training resumes from the last "
            "complete epoch's checkpoint."
        ) from exc
    except PipelineError as exc:  # a sample that cannot be read; from a loader worker, wrapped
        text = str(exc)
        raise PipelineError(text.rsplit("PipelineError: ", 1)[-1].strip()) from None
    finally:
        metrics.removeHandler(handler)
        metrics.propagate = propagate
        bar.close()
        if distributed:
            import torch.distributed as dist

            dist.barrier()  # every rank done (and the checkpoint written) before teardown
        maybe_destroy_distributed()
    last = max((int(p.name) for p in run.checkpoints.iterdir() if p.name.isdigit()), default=None)
    if last is None:
        raise PipelineError(f"training finished without a checkpoint in {run.checkpoints}")
    losses = handler.losses
    result = TrainResult(
        str(run.checkpoints / str(last)),
        options.epochs,
        len(losses),
        losses[0] if losses else None,
        losses[-1] if losses else None,
        losses,
        precision,
        sorted(sample_index(f) for f in val_files),
        workers,
        fused,
    )
    if rank == 0:
        facts = {k: v for k, v in vars(result).items() if k != "losses"}
        run.mark_done("train", **facts)
    return result
