"""controller.coalesce.Coalescer: concurrent calls run as batches, each caller gets its own
result (or its own error), a batch is bounded, a cancelled caller is dropped, and a call
alone runs at once."""

from __future__ import annotations

import asyncio
import threading

import pytest

from controller.coalesce import Coalescer


class Doubler:
    """A batch function that records the batches it ran; refuses negative requests."""

    def __init__(self, delay: float = 0.05) -> None:
        self.batches: list[list[int]] = []
        self.delay, self.started = delay, threading.Event()

    def __call__(self, requests: list[int]) -> list[int]:
        self.batches.append(list(requests))
        self.started.set()
        if any(r < 0 for r in requests):
            raise ValueError(f"negative request in {requests}")
        threading.Event().wait(self.delay)
        return [2 * r for r in requests]


def test_calls_in_flight_run_together_and_each_gets_its_result():
    async def main():
        fn = Doubler()
        c = Coalescer(fn)
        first = asyncio.create_task(c(0))  # runs alone, at once
        await asyncio.to_thread(fn.started.wait, 5)
        rest = [asyncio.create_task(c(i)) for i in range(1, 9)]
        results = await asyncio.wait_for(asyncio.gather(first, *rest), 10)
        return fn.batches, results

    batches, results = asyncio.run(main())
    assert results == [2 * i for i in range(9)]
    assert batches == [[0], list(range(1, 9))]


def test_a_bad_request_fails_only_its_caller():
    async def main():
        fn = Doubler()
        c = Coalescer(fn)
        first = asyncio.create_task(c(100))
        await asyncio.to_thread(fn.started.wait, 5)
        tasks = [asyncio.create_task(c(i)) for i in (1, -1, 3)]
        return fn.batches, await asyncio.wait_for(
            asyncio.gather(first, *tasks, return_exceptions=True), 10
        )

    batches, results = asyncio.run(main())
    assert results[:2] == [200, 2] and results[3] == 6
    assert isinstance(results[2], ValueError) and "negative" in str(results[2])
    assert batches[1] == [1, -1, 3]  # merged, failed, then each alone
    assert sorted(map(tuple, batches[2:])) == [(-1,), (1,), (3,)]


def test_max_requests_bounds_a_batch():
    async def main():
        fn = Doubler()
        c = Coalescer(fn, max_requests=3)
        first = asyncio.create_task(c(0))
        await asyncio.to_thread(fn.started.wait, 5)
        rest = [asyncio.create_task(c(i)) for i in range(1, 8)]
        await asyncio.wait_for(asyncio.gather(first, *rest), 10)
        return fn.batches

    assert [len(b) for b in asyncio.run(main())] == [1, 3, 3, 1]


def test_a_cancelled_caller_is_dropped_and_the_rest_go_on():
    async def main():
        fn = Doubler()
        c = Coalescer(fn)
        first = asyncio.create_task(c(0))
        await asyncio.to_thread(fn.started.wait, 5)
        gone, kept = asyncio.create_task(c(1)), asyncio.create_task(c(2))
        await asyncio.sleep(0)
        gone.cancel()
        out = await asyncio.wait_for(asyncio.gather(first, kept), 10)
        return fn.batches, out, gone.cancelled()

    batches, out, cancelled = asyncio.run(main())
    assert out == [0, 4] and cancelled and batches == [[0], [2]]


def test_a_batch_function_that_miscounts_is_an_error_naming_it():
    def short(requests):
        return requests[:-1]

    async def main():
        return await Coalescer(short)(1)

    with pytest.raises(RuntimeError, match="short returned 0 results for 1 requests"):
        asyncio.run(main())
    with pytest.raises(ValueError, match="max_requests"):
        Coalescer(short, max_requests=0)
