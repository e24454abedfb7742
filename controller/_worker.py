"""Entry point of an actor process: ``python -m controller._worker``.

Serves the actors spawned into this process over one authenticated socket. Async endpoints
run as tasks on the event loop, started in arrival order; plain ``def`` endpoints run in a
one-thread executor per actor (off the loop, in arrival order). Exits when told to, or as soon
as its parent dies (the lifeline pipe reaches EOF), killing its own process group on the way.

At start-up it makes itself non-dumpable, says so on the socket its parent hands the session's
secret over (``FORGE_SESSION_KEY_FD``), and only then receives the secret, which it keeps in
memory only: code it runs for a tool (``forge.envs.sandbox``), or any other process of the
user, can take the secret neither from ``/proc/<pid>/environ``, nor from its memory, nor from
the descriptor it arrives on, not even while the worker starts (docs/security.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import os
import signal
import sys
import threading
import traceback

from controller import _context, _wire, _zygote, env_vars, loops
from controller import _serialization as ser
from controller._runtime import get_runtime

logger = logging.getLogger("controller.worker")
READ_WAIT_S = 60.0  # a READ of bytes this host is still receiving waits this long at most


def _error_body(exc: BaseException) -> bytes:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        pickled = ser.dumps(exc, use_shm=False)[0]
    except Exception:  # noqa: BLE001 - some exceptions cannot be pickled; send text only
        pickled = None
    info = (f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc), tb, pickled)
    return ser.dumps(info, use_shm=False)[0]


class Worker:
    def __init__(self, mesh: str, rank: int, size: int, address: str):
        self.mesh, self.rank, self.size, self.address = mesh, rank, size, address
        self.actors: dict[str, object] = {}
        self.executors: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self.tasks: dict[tuple[int, int], asyncio.Task] = {}
        self.stopped = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        # Shared memory only reaches callers on this host. A TCP worker (Monarch backend) may be
        # called from another host, so its replies carry tensors in-band.
        self.use_shm = address.startswith("unix:")

    # -- dispatch --------------------------------------------------------------------------
    def on_frame(self, proto: _wire.FrameProtocol, kind: int, cid: int, body) -> None:
        if kind == _wire.CALL:
            self._call(proto, cid, body)
        elif kind == _wire.SPAWN:
            self._spawn(proto, cid, body)
        elif kind == _wire.CANCEL:
            task = self.tasks.get((id(proto), cid))
            if task is not None:
                task.cancel()
        elif kind == _wire.STOP_ACTOR:
            self.loop.create_task(self._stop_actor(proto, cid, body))
        elif kind == _wire.PING:
            self._reply(proto, _wire.OK, cid, os.getpid())
        elif kind == _wire.READ:
            self.loop.create_task(self._read(proto, cid, body))
        elif kind == _wire.EXIT:
            self.loop.create_task(self._exit(proto, cid))

    async def _read(self, proto, cid: int, body) -> None:
        """Bytes of a file this process published (``controller._published``)."""
        from controller._published import read_published, wait_readable

        try:
            path, offset, size = ser.loads(body)
            await wait_readable(path, offset, size, READ_WAIT_S)  # a copy still arriving here
            data = await self.loop.run_in_executor(None, read_published, path, offset, size)
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            self._reply(proto, _wire.ERR, cid, e)
            return
        if not proto.closed:  # file bytes go raw, not pickled: one copy less
            proto.send(_wire.OK, cid, data if isinstance(data, bytes) else ser.dumps(data)[0])

    async def _stop_actor(self, proto, cid: int, body) -> None:
        try:
            name = ser.loads(body)
        except Exception as e:  # noqa: BLE001 - a malformed request, reported to the caller
            self._reply(proto, _wire.ERR, cid, e)
            return
        inst = self.actors.pop(name, None)
        if inst is not None:
            await _teardown(inst)
        ex = self.executors.pop(name, None)
        if ex is not None:
            ex.shutdown(wait=False)
        self._reply(proto, _wire.OK, cid, None)

    async def _exit(self, proto, cid: int) -> None:
        for name in list(self.actors):
            await _teardown(self.actors.pop(name))
        self._reply(proto, _wire.OK, cid, None)
        self.stopped.set()

    def _reply(self, proto, kind: int, cid: int, value) -> None:
        if proto.closed:
            return  # the caller is gone; nobody to answer
        if kind == _wire.OK:
            try:
                body = ser.dumps(value, use_shm=self.use_shm)[0]
            except Exception as e:  # noqa: BLE001
                err = TypeError(f"the endpoint's return value could not be pickled: {e}")
                proto.send(_wire.ERR, cid, _error_body(err))
                return
            proto.send(kind, cid, body)
        else:
            proto.send(kind, cid, _error_body(value))

    def _spawn(self, proto, cid, body) -> None:
        try:
            name, cls, args, kwargs = ser.loads(body)
            inst = cls.__new__(cls)
            inst._forge_name = name
            token = _context.current_actor.set(inst)
            try:
                inst.__init__(*args, **kwargs)
            finally:
                _context.current_actor.reset(token)
            self.actors[name] = inst
            self.executors[name] = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix=f"{name}-sync"
            )
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            self._reply(proto, _wire.ERR, cid, e)
            return
        self._reply(proto, _wire.OK, cid, None)

    def _call(self, proto, cid, body) -> None:
        try:
            actor_name, ep_name, args, kwargs = ser.loads(body)
            inst = self.actors.get(actor_name)
            if inst is None:
                raise LookupError(
                    f"no actor {actor_name!r} in process {os.getpid()} (mesh {self.mesh!r} rank "
                    f"{self.rank}); it was stopped or never spawned here"
                )
            prop = getattr(type(inst), ep_name, None)
            if not getattr(prop, "_forge_endpoint", False):
                raise AttributeError(
                    f"{type(inst).__name__}.{ep_name} is not an endpoint; decorate it with "
                    "@endpoint to call it remotely"
                )
        except BaseException as e:  # noqa: BLE001
            self._reply(proto, _wire.ERR, cid, e)
            return
        fn = prop.fn  # pyright: ignore[reportOptionalMemberAccess]  # an endpoint (checked above)
        key = (id(proto), cid)
        if prop.is_async:  # pyright: ignore[reportOptionalMemberAccess]
            # Run the endpoint eagerly up to its first suspension (most calls finish without
            # one). Saves a loop iteration.
            ctx = contextvars.copy_context()
            coro = self._run_async(proto, cid, key, inst, fn, args, kwargs)
            if EAGER_TASKS:  # 3.12+: a Task started eagerly, so asyncio.timeout/wait_for work
                task = asyncio.Task(coro, loop=self.loop, context=ctx, eager_start=True)  # pyright: ignore[reportCallIssue]  # 3.12+
                if not task.done():
                    self.tasks[key] = task
                return
            # 3.10/3.11: the first step runs outside any Task (wait_for works there; an
            # asyncio.timeout() entered before the endpoint's first await does not).
            try:
                first = ctx.run(coro.send, None)
            except StopIteration:
                return
            resume = _resume(coro, first)
            if sys.version_info >= (3, 11):
                self.tasks[key] = self.loop.create_task(resume, context=ctx)
            else:  # 3.10 has no context=: a task copies the context it is created in
                self.tasks[key] = ctx.run(self.loop.create_task, resume)
        else:
            ctx = contextvars.copy_context()
            ctx.run(_context.current_actor.set, inst)
            call = functools.partial(ctx.run, fn, inst, *args, **kwargs)
            fut = self.loop.run_in_executor(self.executors[actor_name], call)
            fut.add_done_callback(lambda f: self._finish(proto, cid, f))

    async def _run_async(self, proto, cid, key, inst, fn, args, kwargs) -> None:
        _context.current_actor.set(inst)
        try:
            value = await fn(inst, *args, **kwargs)
        except asyncio.CancelledError:
            self._reply(proto, _wire.ERR, cid, TimeoutError("call cancelled by the caller"))
            raise
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            self._reply(proto, _wire.ERR, cid, e)
        else:
            self._reply(proto, _wire.OK, cid, value)
        finally:
            self.tasks.pop(key, None)

    def _finish(self, proto, cid, fut) -> None:
        exc = fut.exception()
        if exc is not None:
            self._reply(proto, _wire.ERR, cid, exc)
        else:
            self._reply(proto, _wire.OK, cid, fut.result())


TEARDOWN_TIMEOUT_S = 10.0
# asyncio.Task(..., eager_start=True) (Python 3.12+): the endpoint's first step runs inside
# its Task, where Python 3.12's wait_for (built on asyncio.timeout) needs to be.
EAGER_TASKS = sys.version_info >= (3, 12)


async def _teardown(inst) -> None:
    """Run the actor's optional ``teardown()`` (sync or async, bounded): the graceful-stop
    hook for releasing what process exit would not (e.g. shared-memory files)."""
    hook = getattr(inst, "teardown", None)
    if hook is None or getattr(type(inst).__dict__.get("teardown"), "_forge_endpoint", False):
        return
    try:
        result = hook()
        if asyncio.iscoroutine(result):
            await asyncio.wait_for(result, TEARDOWN_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - teardown must not block stopping
        logger.exception("teardown of %s failed", type(inst).__name__)


class _Resume:
    """Awaitable that continues a coroutine which has already run its first step.

    A coroutine that suspends on a future leaves the future's ``_asyncio_future_blocking``
    flag set for the Task that receives it, and a Task clears it at once. Here the Task
    starts a loop iteration later, and another eagerly started call may await the same
    pending future in between (it would find the flag set and raise "await wasn't used with
    future"). So the flag is cleared when this is built, right after the eager step, as a
    Task would, and set again just before the future is handed to this call's Task.
    """

    __slots__ = ("coro", "first", "blocking")

    def __init__(self, coro, first):
        self.coro, self.first = coro, first
        self.blocking = getattr(first, "_asyncio_future_blocking", False)
        if self.blocking:
            first._asyncio_future_blocking = False

    def __await__(self):
        coro, to_yield = self.coro, self.first
        if self.blocking:
            to_yield._asyncio_future_blocking = True
        while True:
            try:
                sent = yield to_yield
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as e:  # noqa: BLE001 - forwarded into the coroutine
                try:
                    to_yield = coro.throw(e)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    to_yield = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


def _resume(coro, first):
    """A coroutine for a Task that continues ``coro`` after its eager first step."""
    return _await(_Resume(coro, first))


async def _await(awaitable):
    return await awaitable


def _watch_lifeline(fd: int) -> None:
    """Exit the moment the parent's end of the lifeline closes (the parent died)."""
    while True:
        try:
            if not os.read(fd, 1):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    _die()


def _die() -> None:
    try:
        os.killpg(0, signal.SIGKILL)  # we lead our own group: take any children with us
    finally:
        os._exit(1)


async def _main() -> None:
    place = env_vars.worker_place()
    mesh, rank, size, address = place.mesh, place.rank, place.size, place.address
    _context.set_process_rank(rank, place.shape)
    rt = get_runtime()
    worker = Worker(mesh, rank, size, address)
    server = await _wire.serve(address, rt.session.authkey, worker.on_frame, None)
    if address.startswith("tcp:") and address.endswith(":0"):
        # TCP backends: the OS chose the port; report the address callers must use.
        address = f"{address[:-2]}:{server.sockets[0].getsockname()[1]}"
        worker.address = address
        os.environ["FORGE_ADDRESS"] = address  # controller.files.own_address() reads it
    ready = env_vars.ready_fd()
    os.write(ready, f"{os.getpid()} {address}\n".encode())
    os.close(ready)
    async with server:
        await worker.stopped.wait()
    if address.startswith("unix:"):
        try:
            os.unlink(address[5:])
        except FileNotFoundError:
            pass


def _set_title() -> None:
    """``ps`` and ``top`` show ``forge-worker <mesh> <rank>/<size> (controller._worker)``; a
    worker forked by a zygote would otherwise show the zygote's command line. The title fits
    in the space of the original command line (``SPT_NOENV``: the environment's space, which
    ``/proc/<pid>/environ`` reads, is left alone). Without setproctitle: unchanged."""
    place = env_vars.worker_place()
    os.environ.setdefault("SPT_NOENV", "1")
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    setproctitle(f"forge-worker {place.mesh} {place.rank}/{place.size} (controller._worker)")


def main() -> None:
    _zygote.not_dumpable()  # first: the parent hands the secret over only after this
    env_vars.take_session_key()  # before anything can start a child that would inherit it
    _set_title()
    for p in reversed(env_vars.sys_path()):
        if p not in sys.path:
            sys.path.insert(0, p)
    logging.basicConfig(level=env_vars.log_level())
    signal.signal(signal.SIGTERM, lambda *_: _die())
    lifeline = env_vars.lifeline_fd()
    threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True).start()
    loops.run(_main())
    get_runtime().close()  # stop any meshes this process spawned, then leave
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
