"""The HTTP API's hand-off of blocking calls to threads (``commitline/http/threads.py``): every outcome comes
back to its caller as it is, in the caller's context, on at most the threads allowed, whatever the callers do
meanwhile (cancel, close their loop)."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from commitline.http.threads import BlockingCalls

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


def test_a_call_answers_with_its_result_from_another_thread() -> None:
    calls = BlockingCalls(4, "test-calls")

    async def main() -> tuple[int, str]:
        return await calls(lambda a, b: (a + b, threading.current_thread().name), 2, 3)

    total, thread = asyncio.run(main())
    assert total == 5
    assert thread.startswith("test-calls_") and thread != threading.main_thread().name


def test_a_call_that_raises_raises_the_same_error_in_its_caller() -> None:
    calls = BlockingCalls(2, "test-calls")
    error = KeyError("the key")

    def fails() -> None:
        raise error

    async def main() -> None:
        await calls(fails)

    with pytest.raises(KeyError) as raised:
        asyncio.run(main())
    assert raised.value is error


def test_a_call_runs_in_a_copy_of_its_callers_context() -> None:
    calls = BlockingCalls(2, "test-calls")

    def seen_then_changed() -> str:
        seen = request_id.get()
        request_id.set("changed in the thread")
        return seen

    async def main() -> tuple[str, str]:
        request_id.set("request 7")
        seen = await calls(seen_then_changed)
        return seen, request_id.get()

    assert asyncio.run(main()) == ("request 7", "request 7")


def test_concurrent_calls_use_at_most_the_threads_allowed_and_all_complete() -> None:
    calls = BlockingCalls(3, "test-calls")
    lock = threading.Lock()
    running, most = 0, 0
    release = threading.Event()

    def call(i: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(timeout=30)
        with lock:
            running -= 1
        return i

    async def main() -> list[int]:
        futures = [calls(call, i) for i in range(20)]
        while True:  # until the three threads hold a call each (more never start)
            with lock:
                if running >= 3:
                    break
            await asyncio.sleep(0.001)
        release.set()
        return list(await asyncio.gather(*futures))

    assert asyncio.run(main()) == list(range(20))
    assert most == 3
    assert calls.threads == 3


def test_calls_one_after_another_reuse_one_thread() -> None:
    calls = BlockingCalls(8, "test-calls")
    names: set[str] = set()

    async def main() -> None:
        for _ in range(50):
            names.add(await calls(lambda: threading.current_thread().name))
            await wait_until_idle(calls)

    asyncio.run(main())
    assert len(names) == 1
    assert calls.threads == 1


async def wait_until_idle(calls: BlockingCalls) -> None:
    """Until the thread that answered counts itself idle again (it does so just after handing its result back)."""
    while not calls._idle:  # noqa: SLF001 - the hand-off's own count, read to wait for the thread, not asserted
        await asyncio.sleep(0.0005)


def test_a_call_whose_caller_stopped_waiting_runs_to_its_end_and_the_thread_serves_the_next() -> None:
    calls = BlockingCalls(1, "test-calls")
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(timeout=30)
        finished.set()
        return "nobody reads this"

    troubles: list[dict[str, object]] = []

    async def main() -> str:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: troubles.append(context))
        waiting = asyncio.ensure_future(calls(slow))
        await asyncio.to_thread(started.wait, 30)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release.set()
        return await asyncio.wait_for(calls(lambda: "next"), 30)  # the one thread, done with the cancelled call

    assert asyncio.run(main()) == "next"
    assert finished.is_set()
    assert troubles == []  # the dropped outcome was not set on the cancelled future


def test_a_call_outliving_its_loop_leaves_the_thread_serving_other_loops() -> None:
    calls = BlockingCalls(1, "test-calls")
    started, release, done = threading.Event(), threading.Event(), threading.Event()

    def outlives() -> None:
        started.set()
        release.wait(timeout=30)

    async def leave() -> None:
        calls(outlives)
        await asyncio.to_thread(started.wait, 30)

    asyncio.run(leave())  # the loop is closed while the call still runs
    release.set()

    async def again() -> str:
        return await asyncio.wait_for(calls(lambda: (done.set(), "served")[1]), 30)

    assert asyncio.run(again()) == "served"
    assert done.is_set()


def test_no_threads_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BlockingCalls(0, "test-calls")
