"""The ``Actor`` base class: ``options()``, ``as_actor()`` and (with services) ``as_service()``."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from controller._runtime import get_runtime
from controller._spawn import spawn_actor
from controller.future import Future
from controller.mesh import ActorMesh
from controller.options import ActorOptions
from controller.service import Service, ServiceConfig

# ``ActorOptions`` (controller/options.py) and ``spawn_actor`` (controller/_spawn.py) live apart
# so that services need not import this module; both stay importable from here.
__all__ = ["Actor", "ActorOptions", "shutdown", "spawn_actor"]

A = TypeVar("A", bound="Actor")

if TYPE_CHECKING:
    import contextlib
    from collections.abc import Generator

    from controller.endpoint import BoundEndpoint

    H = TypeVar("H", bound="_Handle")

    class _Handle:
        """For type checkers only: what a handle adds to its actor's endpoints.

        ``as_actor``/``as_service`` give handles typed as the actor class (as Monarch's
        ``spawn(name, Class: Type[T]) -> T``), so ``handle.ep`` is the actor's endpoint,
        checked and navigable (``controller/endpoint.py``). The handle's own methods are
        declared here: an ``ActorMesh``'s (``controller/_actor_mesh.py``), and a ``Service``'s
        (``controller/service.py``, ``controller/_routing.py``). At run time ``Actor``
        derives from ``object`` alone; inside the actor these names do not exist, and an
        actor attribute of the same name confuses the checker (rename it). ``Service.metrics``
        is left out: actors have ``metrics`` endpoints (``ReplayBuffer``). The constructor's
        arguments to ``as_actor`` are not checked (a classmethod cannot take them as a
        ``ParamSpec`` of ``cls``).
        """

        # -- an actor mesh (as_actor) ----------------------------------------------------
        def __len__(self) -> int: ...
        @property
        def pids(self) -> list[int]: ...
        @property
        def sizes(self) -> dict[str, int]: ...
        def size(self, dim: str = "procs") -> int: ...
        def slice(self: H, **dims: int | slice) -> H: ...
        def with_default_timeout(self: H, seconds: float | None) -> H: ...
        def __await__(self: H) -> Generator[Any, Any, H]: ...  # ``ProcMesh.spawn``'s wait

        # -- both ------------------------------------------------------------------------
        def endpoint(self, name: str) -> BoundEndpoint[..., Any]: ...
        def shutdown(self) -> Future[None]: ...

        # -- a service (as_service) ------------------------------------------------------
        def session(self) -> contextlib.AbstractAsyncContextManager[str]: ...
        def start_session(self) -> Future[str]: ...
        def terminate_session(self, sid: str) -> Future[None]: ...
        def scale(self, n: int) -> Future[None]: ...
        def request_counts(self) -> dict[str, int]: ...

    _HandleBase = _Handle
else:
    _HandleBase = object


class Actor(_HandleBase):
    """Base class of everything that runs in an actor process.

    Subclass it, decorate methods with ``@endpoint``, then place it with
    ``await MyActor.options(procs=2).as_actor(*init_args)``. An optional ``setup()`` endpoint
    runs on every rank before ``as_actor`` returns, so heavy initialisation errors reach the
    caller. An optional ``__supervise__(failure) -> bool`` is called when a mesh this actor
    spawned loses a process (return True if handled).

    ``preload``: modules every process of this actor imports (comma-separated), e.g.
    ``"torch,transformers"``. On the local backend its processes then fork from a zygote that
    has imported them once (``controller._zygote``): a second replica, or a crashed one's
    restart, starts in milliseconds instead of seconds of imports. A ``FORGE_PRELOAD`` in
    ``options(env_vars=...)`` wins; ``""`` (the default): plain processes.
    """

    preload: ClassVar[str] = ""
    _forge_options: ActorOptions = ActorOptions()

    @classmethod
    def options(
        cls: type[A],
        procs: int = 1,
        hosts: int | None = None,
        with_gpus: bool = False,
        num_replicas: int = 1,
        mesh_name: str | None = None,
        env_vars: dict[str, str] | None = None,
        **extra: Any,
    ) -> type[A]:
        """A configured subclass of this actor (each call independent of the others).
        ``env_vars``: environment variables of its processes (``env`` would read as an RL
        environment, so that keyword is refused)."""
        if "env" in extra:
            raise TypeError("options(env=...) is renamed: pass process variables as env_vars={...}")
        opts = ActorOptions(
            procs, hosts, with_gpus, num_replicas, mesh_name, dict(env_vars or {}), dict(extra)
        )
        base = getattr(cls, "_forge_base", cls)
        return type(
            base.__name__,
            (base,),
            {
                "_forge_options": opts,
                "_forge_base": base,
                "__module__": base.__module__,
                "__qualname__": base.__qualname__,
            },
        )

    @classmethod
    def service_defaults(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Service options this actor picks for itself from its constructor's arguments
        (``as_service`` applies them; those given to ``options(...)`` override them). None by
        default. A replica that batches requests itself, for one, asks for a
        ``replica_max_concurrent_requests`` that lets it fill its batch."""
        return {}

    @classmethod
    def _options(cls) -> ActorOptions:
        return cls.__dict__.get("_forge_options", ActorOptions())

    @classmethod
    def as_actor(cls: type[A], *args: Any, **kwargs: Any) -> Future[A]:
        """Spawn ``procs`` processes, construct the actor on each, run ``setup()`` on every
        rank, and return the ``ActorMesh``. ``mesh.shutdown()`` stops it all again.

        The arguments are the actor's constructor's, and the handle is typed as the actor
        (``_Handle``): ``await mesh.train_step.call(batch)`` is checked against the
        endpoint's signature."""
        opts = cls._options()
        base = getattr(cls, "_forge_base", cls)
        if opts.num_replicas != 1:
            raise ValueError(
                f"{base.__name__}.options(num_replicas={opts.num_replicas}) makes a service: "
                "use .as_service(...) instead of .as_actor(...)"
            )

        async def run() -> ActorMesh:
            return await spawn_actor(base, opts, args, kwargs)

        return cast("Future[A]", Future(run, f"{base.__name__}.as_actor"))

    @classmethod
    def as_service(cls: type[A], *args: Any, **kwargs: Any) -> Future[A]:
        """Start ``num_replicas`` replicas (each its own proc mesh of ``procs`` processes, in
        parallel, ``setup()`` run on each) and return a ``Service`` routing between them.
        Service options (``health_poll_rate``, ``replica_max_concurrent_requests``,
        ``max_retries``, ``unavailable_timeout``, ``router``) are checked here, before any
        process starts. If a replica fails to start, the others stop and the error is raised.
        See docs/services.md. Typed like ``as_actor``: ``await svc.generate.route(prompt)``
        is checked against the endpoint's signature."""
        opts = cls._options()
        base = getattr(cls, "_forge_base", cls)
        defaults = base.service_defaults(*args, **kwargs)
        if defaults:  # the caller's options(...) win over the actor's own choice
            opts = dataclasses.replace(opts, extra={**defaults, **opts.extra})
        config = ServiceConfig.from_options(opts)

        async def run() -> Service:
            return await Service._start(base, opts, config, args, kwargs)

        return cast("Future[A]", Future(run, f"{base.__name__}.as_service"))


def shutdown() -> Future[None]:
    """Stop everything this process spawned (services first, then meshes, newest first)."""

    async def run():
        rt = get_runtime()
        for svc in reversed(list(rt.services)):
            try:
                await svc.shutdown()
            except Exception:  # noqa: BLE001 - keep stopping the rest
                pass
        for pm in reversed(list(rt.proc_meshes)):
            await pm.stop()
        from controller import _zygote

        await asyncio.get_running_loop().run_in_executor(None, _zygote.close_all)

    return Future(run, "shutdown")
