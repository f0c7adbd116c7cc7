"""The shim registry: what each shim patches, where it applies, and what was done.

A :class:`Shim` is data plus two functions: ``probe()`` says whether the drift it fixes is
present in the installed vLLM, ``patch()`` applies the fix and returns the function that undoes
it. Shims are applied when the module they patch is imported (a post-import hook, so importing
``speculators_compat`` before or after vLLM and speculators both work), at most once each
(idempotent), and only when their probe finds the drift. The version range a shim names is the
range it was tested on; on a vLLM outside every tested range the probes still decide, and the
status says the version is untested.

The record (:class:`~speculators_compat.shim.Shim`) and the patch helpers shim modules use live
in :mod:`speculators_compat.shim`, the list in :mod:`speculators_compat.shims`; this module
applies them.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import threading
import traceback
from dataclasses import dataclass

import wrapt
from packaging.specifiers import SpecifierSet

from . import versions
from .releases import RELEASES, TESTED_TEXT
from .shim import PLATFORMS, Shim, Undo
from .shims import BY_NAME, SHIMS
from .versions import in_range, vllm_is_cpu_build

log = logging.getLogger("speculators_compat")

#: Comma-separated shim names to leave alone (``all`` disables every shim).
DISABLE_ENV = "SPECULATORS_COMPAT_DISABLE"
#: Set by ``import speculators_compat``; vLLM processes started from it activate the shims too
#: (through the ``vllm.general_plugins`` entry point), whatever their start method.
ACTIVE_ENV = "SPECULATORS_COMPAT_ACTIVE"

SUPPORTED_SPECULATORS = SpecifierSet("==0.3.*")
SUPPORTED_VLLM = SpecifierSet(">=0.11")
#: The vLLM releases the test matrix runs (:mod:`speculators_compat.releases`).
TESTED_VLLM = tuple(SpecifierSet(f"=={release.minor}.*") for release in RELEASES)
TESTED_VLLM_TEXT = TESTED_TEXT


def is_tested(version) -> bool:
    """``version`` is a vLLM release the test matrix runs."""
    return any(in_range(version, spec) for spec in TESTED_VLLM)


@dataclass
class Status:
    shim: Shim
    state: str  # applied | not needed | disabled | pending | skipped | failed
    reason: str
    #: What the shim's probe found on vLLM's own (unpatched) objects: True (the drift), False,
    #: None (it did not run: disabled, another platform, a module that is not there, it raised).
    drift: bool | None = None


_lock = threading.RLock()
_status: dict[str, Status] = {}
_undo: dict[str, Undo] = {}
_active = False
_hooks_registered = False
_version_gate: str | None = None  # None: not checked yet; "": ok; else the reason to refuse


def _disabled() -> set[str]:
    return {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}


def left_out(name: str) -> bool:
    """``SPECULATORS_COMPAT_DISABLE`` names the shim ``name`` (or is ``all``)."""
    disabled = _disabled()
    return name in disabled or "all" in disabled


def _platform_matches(shim: Shim) -> bool:
    if shim.platform is None:
        return True
    if shim.platform == "vllm-cpu":
        return vllm_is_cpu_build()
    import torch

    return not torch.cuda.is_available()


def _check_versions() -> str:
    """'' when speculators and vLLM are in the supported ranges, else the reason."""
    global _version_gate
    if _version_gate is None:
        v = versions.installed_versions()
        problems = []
        if v.speculators is not None and not in_range(v.speculators, SUPPORTED_SPECULATORS):
            problems.append(f"speculators {v.speculators} (supported: {SUPPORTED_SPECULATORS})")
        if v.vllm is not None and not in_range(v.vllm, SUPPORTED_VLLM):
            problems.append(f"vLLM {v.vllm} (supported: {SUPPORTED_VLLM})")
        _version_gate = ""
        if problems:
            _version_gate = (
                "speculators_compat patches speculators 0.3.x on vLLM >= 0.11; found "
                + " and ".join(problems)
                + ": no shim applied"
            )
            log.warning(_version_gate)
    return _version_gate


def _apply(shim: Shim, absent: str | None = None) -> Status:
    """Apply one shim if it is needed, once. Called from the post-import hook (and by
    ``apply_now`` with ``absent``, the reason its hook module cannot be imported)."""
    with _lock:
        current = _status.get(shim.name)
        if not _active or (current is not None and current.state != "pending"):
            return current
        gate = _check_versions()
        if gate:
            return _set(shim, "skipped", gate)
        if left_out(shim.name):
            return _set(shim, "disabled", f"listed in ${DISABLE_ENV}")
        if not _platform_matches(shim):
            return _set(shim, "not needed", f"applies to {PLATFORMS[shim.platform]} only")
        if absent:
            return _set(shim, "not needed", absent)

        version = versions.installed_versions().vllm
        untested = (
            ""
            if version is None or is_tested(version)
            else (f" (vLLM {version} is untested; the probe decided)")
        )
        on = f"on vLLM {version}" if version is not None else "(vLLM is not installed)"
        try:
            needed = shim.probe()
        except Exception as exc:  # a probe that cannot run is itself a drift worth reporting
            log.error("shim %s: its probe failed:\n%s", shim.name, traceback.format_exc())
            return _set(shim, "failed", f"probe raised {type(exc).__name__}: {exc}")
        if not needed:
            return _set(shim, "not needed", f"probe found no drift {on}{untested}", drift=False)
        if shim.requires:
            # Import what the required shims hook on, so that they are applied (and reported)
            # in this process too, before this one builds on them.

            for name in shim.requires:
                importlib.import_module(BY_NAME[name].hook_module)
        try:
            _undo[shim.name] = shim.patch()
        except Exception as exc:
            log.error("shim %s failed to apply:\n%s", shim.name, traceback.format_exc())
            return _set(shim, "failed", f"patch raised {type(exc).__name__}: {exc}", drift=True)
        log.debug("applied shim %s", shim.name)
        return _set(shim, "applied", f"probe found the drift {on}{untested}", drift=True)


def _set(shim: Shim, state: str, reason: str, drift: bool | None = None) -> Status:
    status = Status(shim, state, reason, drift)
    _status[shim.name] = status
    return status


def activate() -> None:
    """Apply every shim now or as soon as its module is imported. Idempotent."""
    global _active, _hooks_registered

    with _lock:
        _active = True
        os.environ[ACTIVE_ENV] = "1"
        for shim in SHIMS:
            _status.setdefault(shim.name, Status(shim, "pending", f"waiting for {shim.hook_module}"))
        if not _hooks_registered:
            _hooks_registered = True
            for shim in SHIMS:
                wrapt.register_post_import_hook(lambda _mod, s=shim: _apply(s), shim.hook_module)
        else:  # hooks stay registered; re-apply where the module is already imported
            for shim in SHIMS:
                if shim.hook_module in sys.modules:
                    _apply(shim)


def deactivate() -> None:
    """Undo every applied shim (latest first) and stop applying new ones."""
    global _active

    with _lock:
        _active = False
        os.environ.pop(ACTIVE_ENV, None)
        for shim in reversed(SHIMS):
            undo = _undo.pop(shim.name, None)
            if undo is not None:
                undo()
        _status.clear()


def apply_now() -> list[Status]:
    """Import every hooked module (importing vLLM and speculators) so that all shims resolve."""
    activate()
    for shim in SHIMS:
        try:
            importlib.import_module(shim.hook_module)
        except ModuleNotFoundError as exc:
            try:
                _apply(shim, absent=_absent_reason(shim.hook_module, exc))
            except ImportError as error:
                _import_failed(shim, error)
        except ImportError as exc:  # e.g. a name the module imports from vLLM is gone
            _import_failed(shim, exc)
    return status()


def _import_failed(shim: Shim, exc: ImportError) -> None:
    """The shim's hook module exists and does not import: reported as the shim's failure (a
    report, not a crash: ``status`` and ``doctor`` go on with the other shims)."""
    with _lock:
        current = _status.get(shim.name)
        if current is None or current.state == "pending":
            log.error("shim %s: importing %s failed: %s", shim.name, shim.hook_module, exc)
            _set(shim, "failed", f"importing {shim.hook_module} raised {type(exc).__name__}: {exc}")


def _absent_reason(hook_module: str, exc: ModuleNotFoundError) -> str:
    """Why a shim's hook module cannot be imported, where that means the shim has nothing to
    patch: the module is gone from this release, or the package it needs (vLLM, on a machine
    that only trains) is not installed. Anything else is a real error and is raised."""
    top = (exc.name or "").split(".")[0]
    try:
        installed = bool(top) and importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules: blocked, not there
        installed = False
    if top and not installed:
        return f"{top} is not installed here" + (
            "" if hook_module.startswith(top) else f" ({hook_module} imports it)"
        )
    if exc.name and hook_module.startswith(exc.name):
        return f"{hook_module} does not exist in this release"
    raise exc  # the module exists but something it imports is missing: a real error


def status() -> list[Status]:
    """One record per shim, in registry order."""

    with _lock:
        return [
            _status.get(s.name) or Status(s, "inactive", "speculators_compat is deactivated") for s in SHIMS
        ]


def applied() -> list[str]:
    return [s.shim.name for s in status() if s.state == "applied"]


def failed() -> list[Status]:
    """The shims whose probe or patch raised: the drift they fix is then unfixed."""
    return [s for s in status() if s.state == "failed"]


def failure_report(failures: list[Status]) -> str:
    """What failed, what each shim fixes (its symptom, often silently wrong data), the way out."""
    lines = [f"{len(failures)} shim(s) failed on this vLLM/speculators:"]
    for s in failures:
        lines.append(f"  {s.shim.name}: {s.reason}; without it: {s.shim.symptom}")
    names = ",".join(s.shim.name for s in failures)
    lines.append(
        f"`speculators-compat status` shows every shim. Install a tested vLLM ({TESTED_VLLM_TEXT}), or "
        "report the failure; to run without these shims at your own risk (their symptom "
        f"returns), set {DISABLE_ENV}={names}."
    )
    return "\n".join(lines)
