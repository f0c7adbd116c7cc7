"""The shim record and the helpers shim modules patch with.

A :class:`Shim` is data plus two functions: ``probe()`` says whether the drift it fixes is
present in the installed vLLM, ``patch()`` applies the fix and returns the function that undoes
it. :mod:`speculators_compat.shims` lists them; :mod:`speculators_compat.registry` applies them.
This module imports nothing of the package, so every shim module can import it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import wrapt

Undo = Callable[[], None]


@dataclass(frozen=True)
class Shim:
    name: str
    #: What it patches: ``module:qualified.attribute`` (several separated by ", ").
    target: str
    #: vLLM versions on which the drift was seen (and the shim tested), a packaging specifier.
    vllm: str
    #: What a user sees without it: the exact error text, or the wrong result.
    symptom: str
    #: The module whose import triggers applying the shim.
    hook_module: str
    probe: Callable[[], bool]
    patch: Callable[[], Undo]
    speculators: str = "==0.3.*"
    #: "cpu": only where torch has no CUDA device (speculators' training on a CPU);
    #: "vllm-cpu": only with vLLM's CPU build (not a CUDA wheel, even on a machine without a GPU).
    platform: str | None = None
    #: Other shims whose patches this one builds on.
    requires: tuple[str, ...] = field(default=())
    #: transformers versions the drift needs too (None: any), a packaging specifier.
    transformers: str | None = None
    #: The drift breaks vLLM's own engine too (a bug of vLLM's build, outside speculators' path):
    #: the engines that serve-check and ``prepare --regenerate`` start keep this shim, and only
    #: the shims so marked.
    serving: bool = False
    #: Where the drift is tracked or was fixed upstream (the speculators or vLLM issue or PR), or
    #: why there is none.
    upstream: str = ""
    #: The release that makes the shim unneeded, or "never ..." and why.
    remove_when: str = ""


#: Where a shim with ``platform`` set applies: the shim table's "where" column (docs/shims.md,
#: ``speculators-compat status --markdown``) and the registry's reason elsewhere.
PLATFORMS = {"cpu": "training on a CPU", "vllm-cpu": "vLLM's CPU build"}


def markdown_table(shims: list[Shim]) -> str:
    """The shim table of the docs, from the records themselves (tests/test_docs.py compares)."""

    def cell(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    lines = ["| shim | vLLM | where | patches | symptom without it |", "| --- | --- | --- | --- | --- |"]
    for shim in shims:
        vllm = shim.vllm + (f"; transformers {shim.transformers}" if shim.transformers else "")
        where = PLATFORMS.get(shim.platform, "everywhere")
        lines.append(
            f"| `{shim.name}` | `{cell(vllm)}` | {where} | `{cell(shim.target)}` | {cell(shim.symptom)} |"
        )
    lines += ["", "Where each came from and when it goes:", ""]
    lines += ["| shim | upstream | remove when |", "| --- | --- | --- |"]
    lines += [f"| `{s.name}` | {cell(s.upstream)} | {cell(s.remove_when)} |" for s in shims]
    return "\n".join(lines) + "\n"


MARK = "__speculators_compat_shim__"
#: On a module: {name: shim} for the names a shim added to it (see :func:`add_names`).
PROVIDED = "__speculators_compat_provided__"


class ShimProxy(wrapt.ObjectProxy):
    """A stand-in for an object a shim replaces (a module, a class speculators calls through):
    everything not defined on the subclass reaches the real object. Its own state goes in
    ``_self_*`` attributes; the shim's mark stays on the proxy, never on the real object."""

    __speculators_compat_shim__ = None  # set per instance by replace_attr (see MARK)


def undo_all(undos: list[Undo]) -> Undo:
    """One undo for several patches: undone in reverse order of applying."""

    def undo() -> None:
        for u in reversed(undos):
            u()

    return undo


def replace_attr(owner: object, attr: str, new: object, shim: str) -> Undo:
    """Set ``owner.attr = new`` and return the exact undo. ``new`` remembers the original."""
    own = vars(owner) if hasattr(owner, "__dict__") else {}
    had_own = attr in own
    original = own[attr] if had_own else getattr(owner, attr, None)
    if getattr(original, MARK, None) == shim:
        return lambda: None  # already patched by this shim (e.g. inherited through fork)
    try:
        setattr(new, MARK, shim)
        if original is not None and not isinstance(new, wrapt.ObjectProxy):
            new.__wrapped__ = original
    except (AttributeError, TypeError):
        pass
    setattr(owner, attr, new)

    def undo() -> None:
        if had_own:
            setattr(owner, attr, original)
        else:
            delattr(owner, attr)  # it was inherited (or absent): lookups fall through again

    return undo


def add_names(module: object, values: dict[str, object], shim: str) -> Undo:
    """Give ``module`` the names it lacks (a name vLLM moved elsewhere), recorded as the shim's
    so that ``doctor`` reports the move instead of the shim's name; undo removes them."""
    added = {name: value for name, value in values.items() if not hasattr(module, name)}
    for name, value in added.items():
        setattr(module, name, value)
    record = vars(module).setdefault(PROVIDED, {})
    record.update(dict.fromkeys(added, shim))

    def undo() -> None:
        for name in added:
            vars(module).pop(name, None)
            record.pop(name, None)
        if not record:
            vars(module).pop(PROVIDED, None)

    return undo


def provided_by(module_name: str, name: str) -> str | None:
    """The shim that put ``name`` on the (imported) module ``module_name``, if one did."""
    module = sys.modules.get(module_name)
    return getattr(module, PROVIDED, {}).get(name) if module is not None else None
