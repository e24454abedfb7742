"""The runtime's error contract (see docs/errors.md).

User mistakes (bad arguments, calling a method that is not an endpoint, an unpicklable
argument) raise ``ValueError`` / ``TypeError`` / ``AttributeError`` at the call site.
Failures at run time raise a subclass of ``ForgeRuntimeError``:

- ``ActorError``: user code in an endpoint raised; carries the remote type, message and
  traceback text. The actor keeps serving.
- ``ActorDiedError``: the process hosting the actor died (or its connection broke); names
  the mesh, rank, pid and exit code or signal.
- ``ServiceUnavailable``: a service had no healthy replica in time.
- ``CallTimeoutError``: a call did not answer within its timeout; also a ``TimeoutError``.
"""

from __future__ import annotations

import signal


class ForgeRuntimeError(RuntimeError):
    """Base class of the runtime's failure errors."""


def describe_exit(returncode: int | None) -> str:
    """Human text for a ``Popen.returncode``: ``exit code 3`` or ``signal 9 (SIGKILL)``."""
    if returncode is None:
        return "exit status unknown"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"signal {-returncode} ({name})"
    return f"exit code {returncode}"


class ActorError(ForgeRuntimeError):
    """An endpoint raised. ``remote_type``/``remote_message``/``remote_traceback`` describe
    the original exception; ``exception`` is the original object when it could be
    unpickled here (else ``None``)."""

    def __init__(
        self,
        actor: str,
        endpoint: str,
        rank: int,
        remote_type: str,
        remote_message: str,
        remote_traceback: str,
        exception: BaseException | None = None,
    ):
        self.actor = actor
        self.endpoint = endpoint
        self.rank = rank
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.exception = exception
        super().__init__(
            f"{actor}.{endpoint} on rank {rank} raised {remote_type}: {remote_message}\n"
            f"--- remote traceback ---\n{remote_traceback.rstrip()}"
        )

    def __reduce__(self):
        return (
            ActorError,
            (
                self.actor,
                self.endpoint,
                self.rank,
                self.remote_type,
                self.remote_message,
                self.remote_traceback,
                None,
            ),
        )


class ActorDiedError(ForgeRuntimeError):
    """The process hosting an actor rank is gone; calls to it fail with this error."""

    def __init__(
        self,
        mesh: str,
        rank: int,
        pid: int | None,
        returncode: int | None = None,
        detail: str = "",
    ):
        self.mesh = mesh
        self.rank = rank
        self.pid = pid
        self.returncode = returncode
        self.detail = detail
        how = describe_exit(returncode) if returncode is not None else "connection lost"
        msg = f"process for mesh {mesh!r} rank {rank} (pid {pid}) died: {how}"
        if detail:
            msg += f"; {detail}"
        super().__init__(msg)

    @property
    def signal(self) -> int | None:
        """The signal number that killed the process, if it was killed by one."""
        if self.returncode is not None and self.returncode < 0:
            return -self.returncode
        return None

    def __reduce__(self):
        return (ActorDiedError, (self.mesh, self.rank, self.pid, self.returncode, self.detail))


class CallTimeoutError(ForgeRuntimeError, TimeoutError):
    """A call did not complete within its timeout. The remote call may still be running."""


class ServiceUnavailable(ForgeRuntimeError):
    """No healthy replica of a service became available within ``unavailable_timeout``."""


class SpawnError(ForgeRuntimeError):
    """A process or actor failed to start (the message says which and why)."""
