"""The HTTP API's hand-off of blocking calls to threads (``commitline/http/threads.py``): every outcome comes
back to its caller, in the caller's context, on at most the threads allowed, whatever the callers do meanwhile
(cancel, close their loop) and whatever the call raises; the threads end with their ``BlockingCalls``."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import time

import pytest

from commitline.http.threads import BlockingCalls
from tests.support import wait_for

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
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the three threads hold a call each (more never start)
            with lock:
                if running >= 3:
                    break
            await asyncio.sleep(0.001)
        release.set()
        return list(await asyncio.wait_for(asyncio.gather(*futures), 30))

    assert asyncio.run(main()) == list(range(20))
    assert most == 3
    assert calls.threads == 3


def test_calls_one_after_another_reuse_one_thread() -> None:
    calls = BlockingCalls(8, "test-calls")
    names: set[str] = set()

    async def main() -> None:
        for _ in range(50):
            names.add(await asyncio.wait_for(calls(lambda: threading.current_thread().name), 30))

    asyncio.run(main())
    assert len(names) == 1  # the thread counts itself idle before it hands its result back
    assert calls.threads == 1


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


def test_a_call_cancelled_before_a_thread_took_it_is_not_run() -> None:
    calls = BlockingCalls(1, "test-calls")
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def first() -> None:
        started.set()
        release.wait(timeout=30)

    async def main() -> str:
        busy = calls(first)
        await asyncio.to_thread(started.wait, 30)
        queued = calls(ran.append, "the cancelled call")  # waits: the one thread is busy
        queued.cancel()
        release.set()
        await asyncio.wait_for(busy, 30)
        return await asyncio.wait_for(calls(lambda: "after"), 30)  # queued after the cancelled one

    assert asyncio.run(main()) == "after"
    assert ran == []


class Unprintable(BaseException):
    def __str__(self) -> str:
        raise ValueError("no text for this one")


@pytest.mark.parametrize("raised", [StopIteration("empty"), SystemExit(3), asyncio.CancelledError(), Unprintable()],
                         ids=["StopIteration", "SystemExit", "CancelledError", "a BaseException without text"])
def test_what_a_future_cannot_carry_arrives_as_a_runtime_error_and_the_loop_goes_on(raised: BaseException) -> None:
    calls = BlockingCalls(1, "test-calls")

    def raises() -> None:
        raise raised

    async def main() -> tuple[BaseException, str]:
        with pytest.raises(RuntimeError) as caught:
            await asyncio.wait_for(calls(raises), 30)
        return caught.value, await asyncio.wait_for(calls(lambda: "still serving"), 30)

    error, after = asyncio.run(main())
    assert error.__cause__ is raised
    assert type(raised).__name__ in str(error)
    assert after == "still serving"


def test_a_thread_that_cannot_start_fails_its_call_and_takes_no_place(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = BlockingCalls(1, "test-calls")
    real_start = threading.Thread.start
    failures = iter([RuntimeError("can't start new thread")])

    def start(thread: threading.Thread) -> None:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)

    async def main() -> str:
        with pytest.raises(RuntimeError, match="can't start new thread"):
            calls(lambda: "never")
        return await asyncio.wait_for(calls(lambda: "served"), 30)

    assert asyncio.run(main()) == "served"
    assert calls.threads == 1


def test_the_threads_end_once_their_blocking_calls_is_gone() -> None:
    calls = BlockingCalls(4, "test-gone")
    gate = threading.Barrier(3)

    async def main(calls: BlockingCalls) -> None:  # three calls at once: three threads
        await asyncio.wait_for(asyncio.gather(*(calls(gate.wait, 30) for _ in range(3))), 30)

    asyncio.run(main(calls))
    assert calls.threads == 3
    del calls
    gc.collect()
    wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith("test-gone_")],
             "the threads to end once their BlockingCalls is gone", timeout=30)


def test_a_closed_blocking_calls_refuses_calls() -> None:
    calls = BlockingCalls(2, "test-calls")

    async def main() -> None:
        assert await asyncio.wait_for(calls(lambda: 1), 30) == 1
        calls.close()
        with pytest.raises(RuntimeError, match="closed"):
            calls(lambda: 2)

    asyncio.run(main())


def test_no_threads_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BlockingCalls(0, "test-calls")
