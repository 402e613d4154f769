"""A follower process's liveness: alive while its event loop turns, not before it starts, not after it
stopped, and not while a callback holds the loop (a hung process)."""

from __future__ import annotations

import asyncio
import threading

from commitline.infrastructure.liveness import LoopLiveness


def test_alive_only_while_the_loop_runs_and_answers() -> None:
    liveness = LoopLiveness()
    assert liveness.problem() == "the followers have not started yet"
    attached, release, hung = threading.Event(), threading.Event(), threading.Event()

    async def followers(stop: asyncio.Event) -> None:
        liveness.attach(asyncio.get_running_loop())
        attached.set()
        try:
            await stop.wait()
            hung.set()
            release.wait()  # blocks the loop, as a hung follower would
        finally:
            liveness.detach()

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(followers(stop),))
    thread.start()
    try:
        assert attached.wait(30)
        assert liveness.problem() is None
        loop.call_soon_threadsafe(stop.set)
        assert hung.wait(30)
        assert liveness.problem(timeout=0.2) == "the followers' event loop did not answer within 0.2 s"
    finally:
        release.set()
        thread.join(30)
        loop.close()
    assert liveness.problem() == "the followers have stopped"
