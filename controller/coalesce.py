"""Merge an endpoint's concurrent calls into batches: one large piece of work, not many small.

A service replica that computes a forward pass per call (a teacher scoring one group) does the
same work per row whether a call holds one row or thirty, but each call pays the fixed cost of
a forward: with one row a call, thirty calls cost many times one call of thirty rows.
``Coalescer(run_batch)`` sits in front of such an endpoint::

    class Scorer(Actor):
        def __init__(self):
            self.batcher = Coalescer(self._score_many)

        def _score_many(self, requests: list[Request]) -> list[Result]:
            ...  # one result per request, in order; runs in a worker thread

        @endpoint
        async def score(self, request: Request) -> Result:
            return await self.batcher(request)

The first call runs at once (no added latency); calls that arrive while a batch runs wait
and run together as the next batch, so under load batches grow to what is in flight, and
alone a call is a batch of one. ``max_requests`` bounds a batch. If a batch of several
fails, each of its requests runs alone, so an error reaches only the caller whose request
raised it. A caller that is cancelled (its call timed out) is dropped from the results; the
work of a batch already running is not interrupted. Batches run one at a time, in a worker
thread, so the endpoint's event loop stays free to take the next calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

Req = TypeVar("Req")
Res = TypeVar("Res")


class Coalescer(Generic[Req, Res]):
    """Batches concurrent ``await coalescer(request)`` calls (see the module): ``run_batch``
    takes a list of requests and returns one result per request, in order."""

    def __init__(
        self, run_batch: Callable[[list[Req]], list[Res]], max_requests: int | None = None
    ) -> None:
        if max_requests is not None and max_requests < 1:
            raise ValueError(f"max_requests must be >= 1 or None, got {max_requests}")
        self.run_batch, self.max_requests = run_batch, max_requests
        self._pending: list[tuple[Req, asyncio.Future]] = []
        self._drainer: asyncio.Task | None = None
        self.calls = self.batches = 0  # calls taken, batches run (for metrics and tests)

    async def __call__(self, request: Req) -> Res:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self.calls += 1
        self._pending.append((request, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            cut = self.max_requests or len(self._pending)
            batch, self._pending = self._pending[:cut], self._pending[cut:]
            batch = [(r, f) for r, f in batch if not f.done()]  # callers gone: skip
            if batch:
                self.batches += 1
                await self._run(batch)

    async def _run(self, batch: list[tuple[Req, asyncio.Future]]) -> None:
        try:
            results = await asyncio.to_thread(self._checked, [r for r, _ in batch])
        except Exception as e:  # noqa: BLE001 - re-raised to the caller(s) below
            if len(batch) == 1:
                _settle(batch[0][1], error=e)
                return
            for item in batch:  # whose request raised: each alone
                await self._run([item])
            return
        for (_, future), result in zip(batch, results):
            _settle(future, result=result)

    def _checked(self, requests: list[Req]) -> list[Res]:
        results = list(self.run_batch(requests))
        if len(results) != len(requests):
            raise RuntimeError(
                f"{getattr(self.run_batch, '__qualname__', self.run_batch)} returned "
                f"{len(results)} results for {len(requests)} requests; it must return one each"
            )
        return results


def _settle(future: asyncio.Future, result=None, error: BaseException | None = None) -> None:
    if future.done():  # the caller was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
