"""Extension points: every part a user supplies is a plain callable, a built-in name, or an
import string, resolved and checked before anything spawns.

A *slot* is one place where Forge calls user code (a reward function, a data source, a
group filter, an advantage estimator, a loss, a KL estimator, an environment, ...). In
Python a slot takes the callable itself; in YAML it takes

    exact_match                                   # a built-in name
    mypkg.rewards:length_penalty                  # an import string "package.module:attr"
    {fn: mypkg.rewards:length_penalty, kwargs: {target: 100}}   # with keyword arguments

``Slot.resolve(spec, key=...)`` imports the object, binds the keyword arguments (a class is
instantiated with them, a function gets them bound with ``functools.partial``), and checks
that the result can be called the way Forge will call it. Every error names the config key,
the string, what was wrong, and lists the built-ins::

    rewards[0]: 'nope' is not a built-in reward function nor an import string
    'package.module:attr'; built-ins: exact_match, length, math, thinking

*Factory* slots (data sources, environments) hold something that is built later, in the
process that uses it (a data source is built inside its actor); there, resolving checks the
import and that the keyword arguments fit the constructor, calls the factory's own
``check_config(**kwargs)`` when it has one (a cheap check that builds nothing, e.g. that a
game id exists), and returns a zero-argument factory.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PluginSpec", "Slot", "Spec", "describe", "import_string"]


@dataclass
class PluginSpec:
    """A callable named in a config: ``fn`` (built-in name or ``pkg.module:attr``) and the
    keyword arguments to bind to it."""

    fn: str
    """A built-in name of the slot or an import string ``pkg.module:attr``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments bound to it."""


Spec = str | PluginSpec  # what a YAML slot holds; Python callers may also pass a callable


def import_string(text: str) -> Any:
    """The object named by ``"package.module:attr"`` (``attr`` may be dotted: ``Cls.method``).

    Raises ``ValueError`` saying what was wrong: no colon, a module that does not import (with
    the underlying error), or a missing attribute (with the module's public names).
    """
    module_name, sep, attr = text.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{text!r} is not an import string of the form 'package.module:attr'")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the module raising while it imports
        raise ValueError(
            f"{text!r}: module {module_name!r} failed to import ({type(e).__name__}: {e}); "
            "is its package installed or on sys.path?"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(obj) if not n.startswith("_"))
            shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
            raise ValueError(f"{text!r}: {module_name} has no attribute {attr!r}; it has: {shown}")
        obj = getattr(obj, part)
    return obj


def describe(obj: Any) -> Any:
    """A config value for ``obj``: specs stay as they are, callables become their import
    string (``module:qualname``) so a resolved config still dumps to YAML."""
    if isinstance(obj, (str, PluginSpec)):
        return obj
    if isinstance(obj, functools.partial):
        return {"fn": describe(obj.func), "kwargs": dict(obj.keywords)}
    target = obj if inspect.isclass(obj) or inspect.isroutine(obj) else type(obj)
    return f"{target.__module__}:{target.__qualname__}"


class Slot:
    """One extension point. See the module docstring.

    Args:
        kind: what the slot holds, for messages ("reward function", "data source", ...).
        builtins: built-in name -> import string (imported only when used).
        call: how Forge calls the resolved object: ``("prompt", "response", "target")``
            means three positional arguments; names ending in ``=`` are passed by keyword
            (``("logprobs_bt=", ...)``). ``None`` skips the call check.
        factory: the slot holds a factory built later (its kwargs are checked against the
            constructor, and ``resolve`` returns a zero-argument factory).
        needs: methods the built object must have (checked for instances; for factories,
            checked on the class when the factory is a class).
    """

    def __init__(
        self,
        kind: str,
        builtins: Mapping[str, str],
        call: Sequence[str] | None = None,
        *,
        factory: bool = False,
        needs: Sequence[str] = (),
    ) -> None:
        self.kind = kind
        self.builtins = dict(builtins)
        self.call = tuple(call) if call is not None else None
        self.factory = factory
        self.needs = tuple(needs)

    def __repr__(self) -> str:
        return f"Slot({self.kind!r}, builtins={sorted(self.builtins)})"

    def names(self) -> list[str]:
        """The built-in names, sorted."""
        return sorted(self.builtins)

    def resolve(self, spec: Any, *, key: str = "") -> Callable[..., Any]:
        """The callable for ``spec`` (a callable, built-in name, import string, PluginSpec or
        ``{fn, kwargs}`` mapping), checked. ``ValueError`` names ``key`` and what was wrong."""
        where = f"{key}: " if key else ""
        try:
            return self._resolve(spec)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where}{e}") from None

    def validate(self, spec: Any, *, key: str = "") -> None:
        """Raise like ``resolve`` if ``spec`` is not usable; return nothing."""
        self.resolve(spec, key=key)

    # -- internals ------------------------------------------------------------------------

    def _resolve(self, spec: Any) -> Callable[..., Any]:
        if isinstance(spec, Mapping):
            unknown = sorted(set(spec) - {"fn", "kwargs"})
            if unknown or "fn" not in spec:
                raise ValueError(
                    f"a {self.kind} given as a mapping needs 'fn' (and optionally 'kwargs'), "
                    f"got keys {sorted(spec)}"
                )
            spec = PluginSpec(spec["fn"], dict(spec.get("kwargs") or {}))
        if isinstance(spec, str):
            spec = PluginSpec(spec)
        if isinstance(spec, PluginSpec):
            if not isinstance(spec.kwargs, Mapping):
                raise TypeError(f"kwargs of {spec.fn!r} must be a mapping, got {spec.kwargs!r}")
            obj, label = self._lookup(spec.fn), spec.fn
            kwargs = dict(spec.kwargs)
        elif callable(spec):
            obj, label, kwargs = spec, describe(spec), {}
        else:
            raise TypeError(
                f"a {self.kind} must be a callable, a built-in name ({self._listing()}) or an "
                f"import string 'package.module:attr', got {type(spec).__name__} {spec!r}"
            )
        if not callable(obj):
            raise TypeError(f"{label!r} is a {type(obj).__name__}, not a callable {self.kind}")
        if self.factory:  # a configured spec (not a Python object) is checked whole
            return self._factory(obj, label, kwargs, check=isinstance(spec, PluginSpec))
        fn = self._bind(obj, label, kwargs)
        self._check_call(fn, label)
        return fn

    def _lookup(self, name: str) -> Any:
        if name in self.builtins:
            return import_string(self.builtins[name])
        if ":" not in name:
            import difflib

            close = difflib.get_close_matches(name, self.names(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"{name!r} is not a built-in {self.kind}{hint} nor an import string "
                f"'package.module:attr'; built-ins: {self._listing()}"
            )
        return import_string(name)

    def _listing(self) -> str:
        return ", ".join(self.names()) or "(none)"

    def _bind(self, obj: Any, label: str, kwargs: dict[str, Any]) -> Callable[..., Any]:
        """A class is instantiated with ``kwargs``; a function gets them bound."""
        _check_kwargs(obj, label, kwargs)
        if inspect.isclass(obj):
            try:
                instance = obj(**kwargs)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{label!r}({_kw(kwargs)}) failed: {e}") from None
            if not callable(instance):
                raise TypeError(
                    f"{label!r} built an instance with no __call__; a {self.kind} must be callable"
                )
            self._check_needs(instance, label)
            return instance
        self._check_needs(obj, label)
        return functools.partial(obj, **kwargs) if kwargs else obj

    def _factory(
        self, obj: Any, label: str, kwargs: dict[str, Any], check: bool = True
    ) -> Callable[[], Any]:
        _check_kwargs(obj, label, kwargs)
        if inspect.isclass(obj):
            self._check_needs(obj, label)
        check_config = getattr(obj, "check_config", None) if check else None
        if callable(check_config):  # the factory's own cheap check of its arguments, at load
            try:
                check_config(**kwargs)
            except (ValueError, TypeError, ImportError) as e:
                raise ValueError(f"{label!r}: {e}") from None
        return functools.partial(obj, **kwargs)

    def _check_needs(self, obj: Any, label: str) -> None:
        missing = [m for m in self.needs if not callable(getattr(obj, m, None))]
        if missing:
            raise TypeError(f"{label!r} lacks the method(s) {missing} a {self.kind} needs")

    def _check_call(self, fn: Callable[..., Any], label: str) -> None:
        if self.call is None:
            return
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):  # builtins without a signature: trust them
            return
        positional = [a for a in self.call if not a.endswith("=")]
        keywords = {a[:-1]: None for a in self.call if a.endswith("=")}
        try:
            sig.bind(*positional, **keywords)
        except TypeError as e:
            shown = ", ".join(
                a.rstrip("=") + ("=..." if a.endswith("=") else "") for a in self.call
            )
            raise TypeError(
                f"{label!r} has signature {sig} but a {self.kind} is called as fn({shown}): {e}"
            ) from None


def _kw(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def _check_kwargs(obj: Any, label: str, kwargs: Mapping[str, Any]) -> None:
    """The keyword arguments must be accepted by ``obj`` (its constructor for a class)."""
    if not kwargs:
        return
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return
    params = sig.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    accepted = {
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise TypeError(f"{label!r} takes no keyword argument(s) {unknown}; its signature is {sig}")
