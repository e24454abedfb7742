"""``@endpoint``, the call adverbs, and the ``Future`` they return (``controller/future.py``).

Each way of calling an endpoint is its own method (``call``, ``call_one``, ``choose``,
``broadcast``, ``stream``). They pickle the arguments at the call site (an unpicklable
argument fails there, named) and return a lazy ``Future``: ``await fut`` runs it on the
caller's event loop; ``fut.get(timeout)`` runs it on the runtime's background loop, so it
works in plain scripts and even inside a running loop (Jupyter). ``broadcast`` starts at
once (fire and forget).

``timeout=`` given to an adverb bounds the call (``CallTimeoutError``, a ``TimeoutError``)
unless the endpoint itself declares a parameter named ``timeout``; ``ep.with_timeout(s)``
is the explicit form.

Types: ``@endpoint`` keeps the method's signature (``EndpointProperty[P, R]``: its
parameters and its return type, awaited). A handle made by ``as_actor``/``as_service`` is
typed as its actor class (``controller/actor.py``), so to a type checker ``handle.ep`` is a
``BoundEndpoint[P, R]``: every adverb takes the endpoint's own arguments and gives its
return type (``call`` -> ``Future[ValueMesh[R]]``, ``route`` -> ``Future[R]``, ...), and "go
to definition" on ``handle.ep`` lands on the actor's method. These types change nothing
at run time.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    Protocol,
    TypeVar,
    overload,
)

from controller.future import Future

if TYPE_CHECKING:
    from controller.shape import Shape, ValueMesh

logger = logging.getLogger("controller")

P = ParamSpec("P")
R = TypeVar("R")


class EndpointProperty(Generic[P, R]):
    """What ``@endpoint`` turns a method into. On an instance it is the plain bound method
    (an actor calls its own endpoints directly); on a mesh it becomes an ``Endpoint``. ``P``
    and ``R`` are the method's parameters (after ``self``) and its (awaited) return type."""

    _forge_endpoint = True

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.name = fn.__name__
        self.is_async = inspect.iscoroutinefunction(fn)
        self.takes_timeout = "timeout" in inspect.signature(fn).parameters
        functools.update_wrapper(self, fn)

    # On a handle the attribute is an ``Endpoint`` (``ActorMesh.__getattr__``) or a
    # ``ServiceEndpoint`` (``Routing.__getattr__``); handles are typed as their actor class, so
    # a type checker reads ``handle.ep`` through this descriptor and needs the remote view.
    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> EndpointProperty[P, R]: ...

    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> BoundEndpoint[P, R]: ...

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return self.fn.__get__(obj, objtype)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)


@overload
def endpoint(fn: Callable[Concatenate[Any, P], Awaitable[R]]) -> EndpointProperty[P, R]: ...


@overload
def endpoint(fn: Callable[Concatenate[Any, P], R]) -> EndpointProperty[P, R]: ...


def endpoint(fn: Callable[..., Any]) -> EndpointProperty[Any, Any]:
    """Mark an actor method as callable from other processes.

    ``async def`` endpoints run as tasks on the actor's event loop (concurrently, started in
    arrival order); plain ``def`` endpoints run one at a time in a worker thread, off the loop.
    """
    if not callable(fn):
        raise TypeError(f"@endpoint decorates a method, got {fn!r}")
    return EndpointProperty(fn)


class CallTarget(Protocol):
    """What an ``Endpoint`` calls into: an ``ActorMesh``, or ``controller.testing``'s
    ``FakeActorMesh``. Both share ``Endpoint``, so the adverbs and their errors cannot
    drift apart."""

    _display: str
    _shape: Shape

    def _call_all(self, ep: str, args, kwargs, timeout) -> Future[ValueMesh]: ...

    def _call_rank(self, ep: str, index: int | None, args, kwargs, timeout) -> Future: ...

    def _broadcast(self, ep: str, args, kwargs, timeout) -> None: ...

    def _stream(self, ep: str, args, kwargs, timeout) -> AsyncIterator: ...


class Endpoint(Generic[P, R]):
    """An endpoint of an actor mesh; pick how to call it with an adverb."""

    def __init__(self, mesh: CallTarget, prop: EndpointProperty, timeout: float | None = None):
        self._mesh = mesh
        self._prop = prop
        self._timeout = timeout

    @property
    def name(self) -> str:
        return self._prop.name

    def __repr__(self) -> str:
        return f"<endpoint {self._mesh._display}.{self.name}>"

    def __call__(self, *args, **kwargs):
        raise TypeError(
            f"{self!r} is remote: call it with an adverb, e.g. "
            f"`await mesh.{self.name}.call_one(...)`, `.call(...)`, `.choose(...)`, "
            "`.broadcast(...)` or `.stream(...)`"
        )

    def with_timeout(self, seconds: float | None) -> Endpoint[P, R]:
        """The same endpoint, with every call bounded by ``seconds``."""
        return Endpoint(self._mesh, self._prop, seconds)

    def _split(self, kwargs: dict) -> tuple[float | None, dict]:
        if "timeout" in kwargs and not self._prop.takes_timeout:
            kwargs = dict(kwargs)
            return kwargs.pop("timeout"), kwargs
        return self._timeout, kwargs

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]:
        """Call every rank of the mesh; the result has one value per rank."""
        timeout, kw = self._split(kwargs)
        return self._mesh._call_all(self.name, args, kw, timeout)

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call the single rank of a one-rank mesh (slice a larger one first)."""
        timeout, kw = self._split(kwargs)
        n = len(self._mesh._shape)
        if n != 1:
            raise ValueError(
                f"call_one needs a mesh of exactly one rank, but {self._mesh._display} has {n}; "
                f"use .call() for all of them, .choose() for any one, or slice first: "
                f"mesh.slice({self._mesh._shape.labels[0] if self._mesh._shape.labels else 'procs'}=0)"
            )
        return self._mesh._call_rank(self.name, 0, args, kw, timeout)

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call one rank, preferring the one with the fewest calls in flight from here."""
        timeout, kw = self._split(kwargs)
        return self._mesh._call_rank(self.name, None, args, kw, timeout)

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Send to every rank without waiting. Failures are logged and reported to the
        calling actor's ``__supervise__`` hook."""
        timeout, kw = self._split(kwargs)
        self._mesh._broadcast(self.name, args, kw, timeout)

    def stream(self, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[R]:
        """Call every rank; yield each value as soon as its rank answers."""
        timeout, kw = self._split(kwargs)
        return self._mesh._stream(self.name, args, kw, timeout)


if TYPE_CHECKING:

    class BoundEndpoint(Endpoint[P, R]):
        """For type checkers only: ``handle.ep`` on a handle typed as its actor class.

        At run time it is an ``Endpoint`` (an actor mesh's), a ``ServiceEndpoint`` (a
        service's: ``controller/_routing.py``) or, inside the actor itself, the plain bound
        method. A type checker cannot tell these apart, so this type offers every adverb of
        both with the endpoint's own parameters: the mesh's (``call``, ``call_one``,
        ``choose``, ``broadcast``, ``stream``, above) and the service's (``route``,
        ``fanout``, ``fanout_by_replica``, below); the wrong family for the handle fails at
        run time (a service's ``call`` is a ``TypeError`` naming ``route``; a mesh has no
        ``route``). ``timeout=`` given to an adverb is not an endpoint parameter to the
        checker: ``ep.with_timeout(s).call(...)`` is the typed form of the same bound.
        """

        def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
            """Inside the actor: the method itself (its result, or its coroutine)."""

        def with_timeout(self, seconds: float | None) -> BoundEndpoint[P, R]: ...

        @overload
        def route(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]: ...

        @overload
        def route(self, *args: Any, sess_id: str | None, **kwargs: Any) -> Future[R]: ...

        def route(self, *args: Any, **kwargs: Any) -> Future[R]:
            """A service: one healthy replica answers (``ServiceEndpoint.route``)."""
            ...

        def fanout(self, *args: P.args, **kwargs: P.kwargs) -> Future[list[R]]:
            """A service: every healthy replica answers (``ServiceEndpoint.fanout``)."""
            ...

        def fanout_by_replica(self, *args: P.args, **kwargs: P.kwargs) -> Future[dict[int, R]]:
            """A service: ``{replica index: value}`` (``ServiceEndpoint.fanout_by_replica``)."""
            ...
