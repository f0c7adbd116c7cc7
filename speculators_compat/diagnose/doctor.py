"""doctor: check every vLLM API point speculators 0.3.0 (and the shims) touch, without loading a
model, and say per point: matches what speculators expects, shimmed, or drifted in a way no
shim covers (with the evidence).

Each :class:`Point` names how speculators uses it, a check against the installed vLLM's own
objects (not the shimmed names), and the shims that cover a drift there. A point whose check
finds drift is "shimmed" when one of those shims is applied in this process, else "UNCOVERED".
Model classes that a vLLM release does not ship are reported "absent" (nothing to drift from);
a point whose module exists but does not import on this machine (a CUDA wheel's module that needs
a GPU library) is "unknown", with the import error.

doctor needs no GPU: on a machine without one it reads a CUDA wheel's API as well as a CPU
build's (``tools/radar.py`` runs it over every release and writes ``docs/drift-map.md``).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

from ..cpu_alias import ensure_vllm_cpu_alias
from ..registry import apply_now, status
from ..shim import provided_by
from ..shims import BY_NAME, SHIMS
from ..shims._targets import GENERATOR, WORKER

MATCHES, SHIMMED, UNCOVERED, ABSENT, UNKNOWN = "matches", "shimmed", "UNCOVERED", "absent", "unknown"
STATES = (MATCHES, SHIMMED, UNCOVERED, ABSENT, UNKNOWN)


class Absent(Exception):
    """The point does not exist in this vLLM by design (e.g. a model added later)."""


class Unknown(Exception):
    """The point cannot be checked on this machine: a module it lives in exists but does not
    import here (a CUDA wheel's module that needs a GPU library, say). Not drift, not a match."""


def import_module(name: str):
    """``importlib.import_module``, telling drift (the module is gone: ModuleNotFoundError for
    it) from a module that exists but fails to import on this machine (:class:`Unknown`)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise
        raise Unknown(f"{name} does not import here: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise Unknown(f"{name} does not import here: {type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class Point:
    name: str
    #: How speculators 0.3.0 (or a shim) uses it.
    use: str
    #: None when it matches; else the evidence of drift. May raise Absent.
    check: Callable[[], str | None]
    shims: tuple[str, ...] = field(default=())


@dataclass
class Finding:
    point: Point
    state: str
    evidence: str
    shims: list[str]


def resolve(path: str):
    """``module:attr.attr`` -> the object."""
    module_name, _, attrs = path.partition(":")
    obj = import_module(module_name)
    for attr in filter(None, attrs.split(".")):
        obj = getattr(obj, attr)
    return obj


def call_drift(path: str, given: tuple[str, ...]) -> Callable[[], str | None]:
    """Check that ``path`` accepts the keywords ``given`` and needs no others."""

    def check() -> str | None:
        try:
            obj = resolve(path)
        except (ImportError, AttributeError) as exc:
            return f"{path} is gone: {type(exc).__name__}: {exc}"
        params = inspect.signature(obj).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        unknown = [g for g in given if g not in params and not takes_any]
        required = [
            n
            for n, p in params.items()
            if n != "self"
            and p.default is p.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and n not in given
        ]
        problems = []
        if unknown:
            problems.append(f"no parameter {', '.join(unknown)}")
        if required:
            problems.append(
                f"requires {', '.join(required)} (speculators passes {', '.join(given) or 'nothing'})"
            )
        return f"{path.split(':')[1]}: " + "; ".join(problems) if problems else None

    return check


def exists(path: str) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            resolve(path)
        except (ImportError, AttributeError) as exc:
            return f"{path} is gone: {type(exc).__name__}: {exc}"
        module_name, _, attr = path.partition(":")
        shim = provided_by(module_name, attr) if "." not in attr else None
        if shim:
            return f"{path} is gone from vLLM (the name is there because the shim {shim} put it there)"
        return None

    return check


def shim_probe(name: str, evidence: str) -> Callable[[], str | None]:
    """The drift as the shim's own probe found it on vLLM's unpatched objects when the shims
    were applied (``diagnose`` applies them first); a disabled shim's probe runs now, as nothing
    of it is patched."""

    def check() -> str | None:
        found = next(s for s in status() if s.shim.name == name)
        drift = found.drift
        if drift is None and found.state == "disabled":
            drift = BY_NAME[name].probe()
        if drift is None:
            if found.state == "failed":  # its probe raised: a check that cannot run is drift too
                return f"shim {name}: {found.reason}"
            raise Absent(f"shim {name} {found.state}: {found.reason}")
        return evidence if drift else None

    return check


MODEL_MODULES = {
    "LlamaForCausalLM": "vllm.model_executor.models.llama",
    "DeepseekV2ForCausalLM": "vllm.model_executor.models.deepseek_v2",
    "DeepseekV3ForCausalLM": "vllm.model_executor.models.deepseek_v2",
    "KimiK25ForConditionalGeneration": "vllm.model_executor.models.kimi_k25",
}
DECODER_LAYERS = {
    "LlamaForCausalLM": "LlamaDecoderLayer",
    "DeepseekV2ForCausalLM": "DeepseekV2DecoderLayer",
    "DeepseekV3ForCausalLM": "DeepseekV2DecoderLayer",
}
INNER_MODELS = {
    "LlamaForCausalLM": "LlamaModel",
    "DeepseekV2ForCausalLM": "DeepseekV2Model",
    "DeepseekV3ForCausalLM": "DeepseekV2Model",
}
#: What speculators' replacement forward passes to every decoder layer.
LAYER_ARGS = ("positions", "hidden_states", "residual")


def _model_class(arch: str):
    from vllm import ModelRegistry

    if arch not in ModelRegistry.get_supported_archs():
        raise Absent(f"{arch} is not in this vLLM's model registry")
    return getattr(import_module(MODEL_MODULES[arch]), arch)


def _model_points(arch: str) -> list[Point]:
    def registered() -> str | None:
        _model_class(arch)
        return None

    def eagle3() -> str | None:
        from vllm.model_executor.models.interfaces import supports_eagle3

        cls = _model_class(arch)
        return None if supports_eagle3(cls) else f"{arch} does not declare SupportsEagle3"

    def layer_call() -> str | None:
        _model_class(arch)
        path = f"{MODEL_MODULES[arch]}:{DECODER_LAYERS[arch]}.forward"
        missing = call_drift(path, LAYER_ARGS)()
        if missing:
            return missing
        params = [n for n in inspect.signature(resolve(path)).parameters if n not in ("self", *LAYER_ARGS)]
        extra = [n for n in params if not n.startswith("*")]
        if extra:
            return (
                f"{DECODER_LAYERS[arch]}.forward also takes {', '.join(extra)}, which the model's own "
                "forward passes and speculators' replacement forward never does"
            )
        return None

    def embeddings() -> str | None:
        _model_class(arch)
        inner = getattr(import_module(MODEL_MODULES[arch]), INNER_MODELS[arch])
        if not hasattr(inner, "get_input_embeddings"):
            return f"{inner.__name__} has no get_input_embeddings (speculators' forward calls it)"
        return None

    def text_model() -> str | None:
        cls = _model_class(arch)
        source = inspect.getsource(cls.__init__)
        if "self.model =" not in source:
            return (
                f"{arch} keeps its text model elsewhere than .model (speculators patches model.model.forward)"
            )
        return None

    points = [
        Point(f"model {arch}", "the verifier's class", registered),
        Point(
            f"model {arch}: SupportsEagle3",
            "custom_worker gates capture on supports_eagle3(model)",
            eagle3,
            ("hidden_states_capture",),
        ),
        Point(
            f"model {arch}: text model at .model",
            "custom_worker patches model.model.forward",
            text_model,
            ("hidden_states_capture",),
        ),
    ]
    if arch in DECODER_LAYERS:
        points += [
            Point(
                f"model {arch}: decoder layer call",
                "layer(hidden_states=, positions=, residual=)",
                layer_call,
                ("hidden_states_capture",),
            ),
            Point(
                f"model {arch}: get_input_embeddings",
                "base_model.get_input_embeddings(input_ids)",
                embeddings,
                ("hidden_states_capture",),
            ),
        ]
    return points


CONFIG = "vllm.config"
GEN_CALLS = [
    Point(
        "CacheConfig(...)",
        "CacheConfig(block_size=, gpu_memory_utilization=)",
        call_drift(f"{CONFIG}:CacheConfig", ("block_size", "gpu_memory_utilization")),
    ),
    Point(
        "CacheConfig prefix caching",
        "every prompt token computed (capture needs them all)",
        shim_probe("cache_config_prefix_caching", "CacheConfig(...).enable_prefix_caching defaults to True"),
        ("cache_config_prefix_caching",),
    ),
    Point(
        "ModelConfig(...)",
        "ModelConfig(model=, tokenizer=, trust_remote_code=, dtype=, max_model_len=, enforce_eager=)",
        call_drift(
            f"{CONFIG}:ModelConfig",
            ("model", "tokenizer", "trust_remote_code", "dtype", "max_model_len", "enforce_eager"),
        ),
    ),
    Point(
        "ParallelConfig(...)",
        "ParallelConfig(tensor_parallel_size=, worker_extension_cls=)",
        call_drift(f"{CONFIG}:ParallelConfig", ("tensor_parallel_size", "worker_extension_cls")),
    ),
    Point(
        "SchedulerConfig(...)",
        "SchedulerConfig(max_num_seqs=, max_model_len=, max_num_batched_tokens=)",
        call_drift(f"{CONFIG}:SchedulerConfig", ("max_num_seqs", "max_model_len", "max_num_batched_tokens")),
        ("scheduler_config_encoder_decoder",),
    ),
    Point("DeviceConfig()", "DeviceConfig()", call_drift(f"{CONFIG}:DeviceConfig", ())),
    Point("LoadConfig()", "LoadConfig()", call_drift(f"{CONFIG}:LoadConfig", ())),
    Point(
        "VllmConfig(...)",
        "VllmConfig(model_config=, cache_config=, parallel_config=, scheduler_config=, ...)",
        call_drift(
            f"{CONFIG}:VllmConfig",
            (
                "model_config",
                "cache_config",
                "parallel_config",
                "scheduler_config",
                "device_config",
                "load_config",
            ),
        ),
    ),
    Point(
        "unify_hybrid_kv_cache_specs",
        "from vllm.v1.core.kv_cache_utils import unify_hybrid_kv_cache_specs",
        exists("vllm.v1.core.kv_cache_utils:unify_hybrid_kv_cache_specs"),
        ("kv_cache_utils_moved",),
    ),
    Point(
        "_get_kv_cache_groups_uniform_spec",
        "from vllm.v1.core.kv_cache_utils import _get_kv_cache_groups_uniform_spec",
        exists("vllm.v1.core.kv_cache_utils:_get_kv_cache_groups_uniform_spec"),
        ("kv_cache_utils_moved",),
    ),
    Point(
        "get_kv_cache_config_from_groups",
        "from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups",
        exists("vllm.v1.core.kv_cache_utils:get_kv_cache_config_from_groups"),
        ("kv_cache_utils_moved",),
    ),
    Point(
        "get_kv_cache_config_from_groups(...)",
        "get_kv_cache_config_from_groups(vllm_config=, kv_cache_groups=, kv_cache_specs=, available_memory=)",
        call_drift(
            "vllm.v1.core.kv_cache_utils:get_kv_cache_config_from_groups",
            ("vllm_config", "kv_cache_groups", "kv_cache_specs", "available_memory"),
        ),
        ("kv_cache_config_specs",),
    ),
    Point(
        "StructuredOutputManager(...)",
        "StructuredOutputManager(vllm_config=)",
        call_drift("vllm.v1.structured_output:StructuredOutputManager", ("vllm_config",)),
    ),
    Point(
        "Scheduler(...)",
        "Scheduler(vllm_config=, kv_cache_config=, structured_output_manager=)",
        call_drift(
            "vllm.v1.core.sched.scheduler:Scheduler",
            ("vllm_config", "kv_cache_config", "structured_output_manager"),
        ),
        ("scheduler_block_size",),
    ),
    Point(
        "Scheduler loop",
        "add_request, schedule, update_from_output, has_unfinished_requests (token_attribution)",
        lambda: next(
            (
                m
                for m in ("add_request", "schedule", "update_from_output", "has_unfinished_requests")
                if not hasattr(resolve("vllm.v1.core.sched.scheduler:Scheduler"), m)
            ),
            None,
        ),
    ),
    Point(
        "Request(...)",
        "Request(request_id=, prompt_token_ids=, sampling_params=, pooling_params=, eos_token_id=, "
        "arrival_time=)",
        call_drift(
            "vllm.v1.request:Request",
            (
                "request_id",
                "prompt_token_ids",
                "sampling_params",
                "pooling_params",
                "eos_token_id",
                "arrival_time",
            ),
        ),
        ("request_eos_token_id",),
    ),
    Point(
        "RequestStatus.FINISHED_ABORTED",
        "scheduler.finish_requests(..., FINISHED_ABORTED)",
        exists("vllm.v1.request:RequestStatus.FINISHED_ABORTED"),
    ),
    Point(
        "SamplingParams(...)",
        "SamplingParams(max_tokens=, temperature=)",
        call_drift("vllm.sampling_params:SamplingParams", ("max_tokens", "temperature")),
    ),
    Point(
        "MultiprocExecutor(...)",
        "MultiprocExecutor(vllm_config=)",
        call_drift("vllm.v1.executor.multiproc_executor:MultiprocExecutor", ("vllm_config",)),
        ("generator_executor",),
    ),
    Point(
        "MultiprocExecutor.collective_rpc(...)",
        "collective_rpc(method, args=, unique_reply_rank=)",
        call_drift(
            "vllm.v1.executor.multiproc_executor:MultiprocExecutor.collective_rpc",
            ("method", "args", "unique_reply_rank"),
        ),
    ),
    Point(
        "collective_rpc reply",
        "collective_rpc(..., unique_reply_rank=0)[0]",
        shim_probe(
            "collective_rpc_unique_reply",
            "collective_rpc(unique_reply_rank=...) returns the one reply, not a list (speculators reads [0])",
        ),
        ("collective_rpc_unique_reply",),
    ),
    Point(
        "execute_model convention",
        "execute_model(scheduler_output) -> ModelRunnerOutput",
        shim_probe(
            "executor_sample_tokens",
            "execute_model returns None and sample_tokens() must follow "
            "(speculators calls execute_model only)",
        ),
        ("executor_sample_tokens",),
    ),
    Point(
        "MultiprocExecutor lifecycle",
        "initialize_from_config(kv_cache_configs), shutdown()",
        lambda: next(
            (
                f"no {m}"
                for m in ("initialize_from_config", "shutdown", "execute_model")
                if not hasattr(resolve("vllm.v1.executor.multiproc_executor:MultiprocExecutor"), m)
            ),
            None,
        ),
    ),
]
WORKER_CALLS = [
    Point(
        "get_pp_group / get_tp_group",
        "custom_worker imports them from vllm.distributed",
        lambda: exists("vllm.distributed:get_pp_group")() or exists("vllm.distributed:get_tp_group")(),
    ),
    Point(
        "supports_eagle3",
        "custom_worker imports it from vllm.model_executor.models.interfaces",
        exists("vllm.model_executor.models.interfaces:supports_eagle3"),
    ),
    Point(
        "IntermediateTensors",
        "custom_worker imports it from vllm.sequence",
        exists("vllm.sequence:IntermediateTensors"),
    ),
    Point(
        "worker get_kv_cache_spec",
        "collective_rpc('get_kv_cache_spec')",
        exists("vllm.v1.worker.gpu_worker:Worker.get_kv_cache_spec"),
    ),
]


def _speculators_imports() -> str | None:
    """With the shims applied, speculators' generator and worker modules import (a name they
    import from vLLM that is gone and no shim provides fails here)."""
    for name in (GENERATOR, WORKER):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return f"import {name}: {type(exc).__name__}: {exc}"
    return None


IMPORTS = [
    Point(
        "speculators' generator imports",
        "import vllm_hidden_states_generator, custom_worker (their from-vllm imports)",
        _speculators_imports,
    ),
]


def points() -> list[Point]:
    """The API points of speculators 0.3.0 and the shims (the drift map's rows)."""
    models = [p for arch in MODEL_MODULES for p in _model_points(arch)]
    return IMPORTS + GEN_CALLS + WORKER_CALLS + models


def shim_points(named: list[Point]) -> list[Point]:
    """One point per shim that no API point names: its own probe, so that every drift a shim
    fixes shows in ``doctor``."""
    covered = {name for point in named for name in point.shims}
    return [
        Point(
            f"shim {shim.name}",
            shim.target,
            shim_probe(shim.name, f"its probe found the drift; without it: {shim.symptom}"),
            (shim.name,),
        )
        for shim in SHIMS
        if shim.name not in covered
    ]


def diagnose() -> list[Finding]:
    """Apply the shims (importing vLLM and speculators, loading no model) and check every point."""
    ensure_vllm_cpu_alias()

    applied = {s.shim.name for s in apply_now() if s.state == "applied"}
    findings = []
    api = points()
    for point in api + shim_points(api):
        try:
            evidence = point.check()
        except Absent as exc:
            findings.append(Finding(point, ABSENT, str(exc), []))
            continue
        except Unknown as exc:
            findings.append(Finding(point, UNKNOWN, str(exc), []))
            continue
        except Exception as exc:  # a check that cannot run is drift too
            evidence = f"check raised {type(exc).__name__}: {exc}"
        if not evidence:
            findings.append(Finding(point, MATCHES, "", []))
            continue
        covering = [s for s in point.shims if s in applied]
        findings.append(Finding(point, SHIMMED if covering else UNCOVERED, evidence, covering))
    return findings
