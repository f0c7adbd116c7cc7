"""The package's structure: no import cycle among its modules (function-level imports included)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "speculators_compat"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """What an import statement of module ``name`` (at ``path``) names: the module, and for
    ``from X import a`` also ``X.a`` (which may be a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target] + [f"{target}.{a.name}" for a in node.names]


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its code (a parent package, which
    is always imported first, does not count)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(name, path, node):
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    assert "speculators_compat.shim" in graph["speculators_compat.shims.scheduler_block_size"]
    assert cycles(graph) == []


#: The tooling beside the core: the pipeline, diagnosis, the oracle, the tiny fixtures and the CLI.
#: Everything else in the package is the core (the registry, the patch helpers, the shims and what
#: they use), which imports none of these, so that what the core does on import can be read there.
TOOLING = (
    "speculators_compat.pipeline",
    "speculators_compat.diagnose",
    "speculators_compat.oracle",
    "speculators_compat.tiny",
    "speculators_compat.cli",
    "speculators_compat.__main__",
)


def is_tooling(module: str) -> bool:
    return any(module == t or module.startswith(t + ".") for t in TOOLING)


def core_imports_of_tooling(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted(
        (name, target)
        for name, targets in graph.items()
        if not is_tooling(name)
        for target in targets
        if is_tooling(target)
    )


def test_the_checker_finds_the_core_importing_tooling():
    graph = {"speculators_compat.shims.x": {"speculators_compat.pipeline.serve"}}
    found = core_imports_of_tooling(graph)
    assert found == [("speculators_compat.shims.x", "speculators_compat.pipeline.serve")]


def test_the_core_imports_no_tooling():
    graph = import_graph()
    assert all(t in graph or any(m.startswith(t + ".") for m in graph) for t in TOOLING)
    assert "speculators_compat.registry" in graph and not is_tooling("speculators_compat.registry")
    assert core_imports_of_tooling(graph) == []


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layering_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports across the tooling's layers the other way round: the CLI mounts the pipeline and
    diagnosis, and diagnosis drives the pipeline; so nothing imports the CLI (but its own
    modules and ``__main__``) and the pipeline never imports diagnosis."""
    found = []
    for name, targets in graph.items():
        for target in targets:
            into_cli = _inside(target, "speculators_compat.cli") and not (
                _inside(name, "speculators_compat.cli") or name == "speculators_compat.__main__"
            )
            pipeline_to_diagnose = _inside(name, "speculators_compat.pipeline") and _inside(
                target, "speculators_compat.diagnose"
            )
            if into_cli or pipeline_to_diagnose:
                found.append((name, target))
    return sorted(found)


def test_the_checker_finds_imports_against_the_layers():
    graph = {
        "speculators_compat.pipeline.runner": {"speculators_compat.diagnose.preflight"},
        "speculators_compat.tiny": {"speculators_compat.cli.fixtures"},
        "speculators_compat.cli.core": {"speculators_compat.cli.common"},
        "speculators_compat.__main__": {"speculators_compat.cli"},
    }
    assert layering_violations(graph) == [
        ("speculators_compat.pipeline.runner", "speculators_compat.diagnose.preflight"),
        ("speculators_compat.tiny", "speculators_compat.cli.fixtures"),
    ]


def test_nothing_imports_the_cli_and_the_pipeline_never_imports_diagnosis():
    graph = import_graph()
    assert "speculators_compat.cli.pipeline" in graph and "speculators_compat.diagnose.preflight" in graph
    assert layering_violations(graph) == []


def test_importing_any_module_activates_nothing_beyond_the_package():
    """``import speculators_compat`` is the one import that activates (unless
    ``SPECULATORS_COMPAT_AUTO=0``); importing any other module of the package, core or tooling,
    afterwards applies no shim, registers no import hook and writes no environment variable."""
    from tests.helpers import run_python

    code = """
    import importlib, json, os, pkgutil, sys
    import vllm  # a vLLM process: what the hooks act on is already imported
    env = dict(os.environ)
    meta_path = list(sys.meta_path)
    import speculators_compat
    from speculators_compat import registry
    after_package = {"applied": registry.applied(), "hooks": len(sys.meta_path) - len(meta_path),
                     "env": sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k))}
    env, meta_path = dict(os.environ), list(sys.meta_path)
    names = [m.name for m in pkgutil.walk_packages(speculators_compat.__path__, "speculators_compat.")
             if not m.name.endswith("__main__")]
    for name in names:
        importlib.import_module(name)
    print(json.dumps({
        "modules": len(names), "after_package": after_package, "applied": registry.applied(),
        "hooks": [repr(f) for f in sys.meta_path if f not in meta_path],
        "env": sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k)),
    }))
    """
    off = run_python(code, env={"SPECULATORS_COMPAT_AUTO": "0"})
    assert off["modules"] > 50
    assert off["after_package"] == {"applied": [], "hooks": 0, "env": []}
    assert (off["applied"], off["hooks"], off["env"]) == ([], [], [])
    on = run_python(code, env={"SPECULATORS_COMPAT_AUTO": None})
    assert on["after_package"]["applied"], "activation applied nothing: the comparison would prove nothing"
    assert on["applied"] == on["after_package"]["applied"]
    assert (on["hooks"], on["env"]) == ([], [])


#: What ``import speculators_compat`` and the CLI's start may load besides the standard library:
#: the light dependencies in pyproject.toml. Everything else (torch, vLLM, speculators,
#: transformers, datasets, ...) is imported inside the functions that use it, so that importing
#: the package, or ``speculators-compat --help``, costs no torch start-up.
LIGHT = frozenset({"packaging", "click", "wrapt", "filelock"})
HEAVY = ("torch", "vllm", "speculators", "transformers", "numpy", "safetensors", "datasets", "tokenizers")


def _is_light_third_party(module: str) -> bool:
    root = module.split(".")[0]
    return root in sys.stdlib_module_names or root in LIGHT


def heavy_modules(modules: dict[str, Path]) -> set[str]:
    """The package's modules whose own top-level imports reach a module that is not light."""
    top: dict[str, set[str]] = {}
    heavy = set()
    for name, path in modules.items():
        top[name] = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(name, path, node):
                    if target in modules:
                        top[name].add(target)
                    elif not target.startswith("speculators_compat") and not _is_light_third_party(target):
                        heavy.add(name)
    changed = True
    while changed:
        changed = False
        for name, targets in top.items():
            if name not in heavy and targets & heavy:
                heavy.add(name)
                changed = True
    return heavy


def misplaced_function_imports(modules: dict[str, Path]) -> list[str]:
    """Imports inside functions that keep nothing light: of the standard library, of a light
    dependency, or of a module of the package that is itself light. A deferred import of a light
    module says why on its line (``# deferred: ...``, e.g. the package's ``__init__`` imports the
    module that needs it)."""
    heavy = heavy_modules(modules)
    found = set()
    for name, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        for function in ast.walk(ast.parse(source)):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                if "# deferred:" in lines[node.lineno - 1]:
                    continue
                targets = _targets(name, path, node)
                own = [t for t in targets if t in modules]
                if targets[0].startswith("speculators_compat") or own:
                    light = not any(t in heavy for t in own)
                else:
                    light = _is_light_third_party(targets[0])
                if light:
                    found.add(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def test_the_checker_finds_a_function_import_that_defers_nothing(tmp_path):
    package = tmp_path / "speculators_compat"
    package.mkdir()
    (package / "light.py").write_text("import json\n")
    (package / "heavy.py").write_text("import torch\n")
    (package / "user.py").write_text(
        "def f():\n    import os\n    from . import light\n    from . import heavy\n    import torch\n"
        "    from .light import x  # deferred: a reason\n"
    )
    modules = {f"speculators_compat.{p.stem}": p for p in package.glob("*.py")}
    assert heavy_modules(modules) == {"speculators_compat.heavy"}
    assert misplaced_function_imports(modules) == [
        "speculators_compat.user:2: import os",
        "speculators_compat.user:3: from . import light",
    ]


def test_function_level_imports_only_defer_heavy_modules():
    modules = _modules()
    assert "speculators_compat.oracle.reference" in heavy_modules(modules)
    assert "speculators_compat.registry" not in heavy_modules(modules)
    assert misplaced_function_imports(modules) == []


def test_importing_the_package_and_the_cli_loads_no_heavy_module():
    """In a fresh interpreter (not the suite's fork server, which holds torch already; and without
    ``SPECULATORS_COMPAT_ACTIVE``, with which vLLM's plugin hook loads the generator)."""
    import os

    from speculators_compat.registry import ACTIVE_ENV
    from tests.helpers import fresh

    code = "import sys, speculators_compat, speculators_compat.cli\n"
    code += f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    env = {k: v for k, v in os.environ.items() if k != ACTIVE_ENV}
    proc = fresh(["-c", code], env=env, fork=False)
    assert (proc.returncode, proc.stdout.strip()) == (0, "[]"), proc.stderr[-2000:]
    # the check can fail: the same interpreter, told to load torch, reports it
    proc = fresh(["-c", "import torch\n" + code], env=env, fork=False)
    assert "torch" in proc.stdout


#: The run's stages in the order ``run`` takes them (serve-check last), each with its modules. A
#: stage reads what earlier stages wrote from the run folder (``pipeline/layout.py``), never
#: through their code, so that following a run visits each stage's module once, in order.
STAGE_MODULES = {
    "prepare": ("prepare", "regenerate"),
    "extract": ("extract",),
    "vocab": ("vocab",),
    "train": ("train",),
    "serve-check": ("serve", "check"),
}
#: ``prepare --regenerate`` runs the verifier with serve-check's engine (``serve.run_engine``).
STAGE_EXCEPTIONS = {("regenerate", "serve")}


def stage_crossings(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    stage_of = {
        f"speculators_compat.pipeline.{m}": stage for stage, modules in STAGE_MODULES.items() for m in modules
    }
    return sorted(
        (name.rsplit(".", 1)[1], target.rsplit(".", 1)[1])
        for name, targets in graph.items()
        if name in stage_of
        for target in targets
        if target in stage_of
        and stage_of[target] != stage_of[name]
        and (name.rsplit(".", 1)[1], target.rsplit(".", 1)[1]) not in STAGE_EXCEPTIONS
    )


def test_the_checker_finds_a_stage_reaching_into_another():
    graph = {"speculators_compat.pipeline.train": {"speculators_compat.pipeline.serve"}}
    assert stage_crossings(graph) == [("train", "serve")]


def test_no_stage_imports_another_stages_module():
    graph = import_graph()
    assert all(f"speculators_compat.pipeline.{m}" in graph for ms in STAGE_MODULES.values() for m in ms)
    assert stage_crossings(graph) == []
