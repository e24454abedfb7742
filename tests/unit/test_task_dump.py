"""``kill -USR1``: a Forge process prints its asyncio tasks and the awaits they wait in."""

from __future__ import annotations

import asyncio
import os
import signal

from controller import task_dump


async def _parked(event: asyncio.Event) -> None:
    await _deeper(event)


async def _deeper(event: asyncio.Event) -> None:
    await event.wait()


async def test_sigusr1_prints_each_task_with_its_chain_of_awaits(capsys):
    task_dump.install(asyncio.get_running_loop())
    try:
        event = asyncio.Event()
        task = asyncio.create_task(_parked(event), name="parked-one")
        await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGUSR1)
        await asyncio.sleep(0.05)  # the handler runs on the loop
        event.set()
        await task
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
    err = capsys.readouterr().err
    assert f"[task dump] pid {os.getpid()}" in err
    block = err.split("task parked-one:")[1]
    lines = [x.strip() for x in block.splitlines()[1:4]]
    assert lines[0].endswith("in _parked") and lines[1].endswith("in _deeper"), lines
    assert lines[2].endswith("in wait"), lines  # asyncio.Event.wait, where it is parked


def test_a_finished_coroutine_has_no_chain():
    async def done():
        return 1

    coro = done()
    try:
        coro.send(None)
    except StopIteration:
        pass
    assert task_dump.await_chain(coro) == []
