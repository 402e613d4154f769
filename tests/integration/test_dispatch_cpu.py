"""``COMMITLINE_DISPATCH_CPU``: the threads that dispatch move to one CPU; ``auto`` processes claim distinct
ones, and a CPU a killed process held is free again. Real threads, real processes, real kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from commitline.application.errors import ConfigurationError
from commitline.application.processor import DispatchObserver
from commitline.composition import bootstrap
from commitline.infrastructure.dispatch_cpu import usable_cpus
from commitline.infrastructure.config import load_settings
from tests.support import settings_for

USABLE = usable_cpus()


def receive(item: uuid.UUID) -> dict[str, Any]:
    return {"type": "receive_stock", "item_id": str(item), "quantity": 1}


class CpuOfEachCommand(DispatchObserver):
    """Records, in the dispatching thread itself, the CPUs it may run on as its command ends."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, set[int]]] = []
        self.lock = threading.Lock()

    def on_outcome(self, command_type: str, outcome: str, code: str | None, seconds: float) -> None:
        with self.lock:
            self.seen.append((threading.current_thread().name, usable_cpus()))


def test_a_thread_that_dispatches_moves_to_the_configured_cpu_and_others_stay_free(pg_dsn: str, schema: str) -> None:
    cpu = max(USABLE)
    before: dict[str, set[int]] = {}
    after: dict[str, set[int]] = {}
    with bootstrap(settings_for(pg_dsn, schema, dispatch_cpu=str(cpu))) as app:
        def dispatcher() -> None:
            before["dispatcher"] = usable_cpus()
            app.dispatch(receive(uuid.uuid4()), idempotency_key=f"k-{uuid.uuid4()}")
            after["dispatcher"] = usable_cpus()

        def bystander() -> None:
            after["bystander"] = usable_cpus()

        for target in (dispatcher, bystander):
            thread = threading.Thread(target=target)
            thread.start()
            thread.join()
    assert before["dispatcher"] == USABLE
    assert after["dispatcher"] == {cpu}
    assert after["bystander"] == USABLE, "a thread that never dispatched must keep every CPU"


def test_dispatch_many_runs_every_command_on_the_configured_cpu(pg_dsn: str, schema: str) -> None:
    cpu = min(USABLE)
    observer = CpuOfEachCommand()
    with bootstrap(settings_for(pg_dsn, schema, dispatch_cpu=str(cpu))) as app:
        app.processor.observer = observer

        def run() -> None:
            items = [(receive(uuid.uuid4()), f"many-{i}", "default") for i in range(40)]
            outcomes = app.processor.dispatch_many(items, concurrency=8)
            assert all(not isinstance(o, Exception) for o in outcomes), outcomes

        thread = threading.Thread(target=run)  # the pool's threads are started by this one, itself still free
        thread.start()
        thread.join()
    assert len(observer.seen) == 40
    assert {name for name, _ in observer.seen} != {thread.name}, "the commands ran in the pool's threads"
    assert all(cpus == {cpu} for _, cpus in observer.seen), observer.seen


def test_off_touches_no_thread(pg_dsn: str, schema: str) -> None:
    observer = CpuOfEachCommand()
    with bootstrap(settings_for(pg_dsn, schema, dispatch_cpu="off")) as app:
        app.processor.observer = observer
        thread = threading.Thread(target=lambda: app.dispatch(receive(uuid.uuid4()), idempotency_key="off"))
        thread.start()
        thread.join()
    assert observer.seen == [(thread.name, USABLE)]


def test_a_cpu_this_process_may_not_use_is_refused_before_anything_is_written(pg_dsn: str, schema: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        bootstrap(settings_for(pg_dsn, schema, dispatch_cpu="4095"))
    message = str(refused.value)
    assert "COMMITLINE_DISPATCH_CPU" in message and "4095" in message
    with psycopg.connect(pg_dsn) as conn:
        found = conn.execute("SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s",
                             (schema,)).fetchone()
    assert found == (0,), "the schema must not have been created"


@pytest.mark.parametrize("value", ["fast", "-1", "1,2", "on"])
def test_a_malformed_setting_names_the_variable(value: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        load_settings({"COMMITLINE_DISPATCH_CPU": value})
    assert "COMMITLINE_DISPATCH_CPU" in str(refused.value) and repr(value) in str(refused.value)


# A process that claims its CPU (auto), says which, and holds it until its stdin closes.
_CLAIMER = textwrap.dedent("""
    import sys
    from commitline.composition import bootstrap
    from tests.support import settings_for
    with bootstrap(settings_for(sys.argv[1], sys.argv[2], dispatch_cpu="auto")) as app:
        print(app.dispatch_cpu.cpu, flush=True)
        sys.stdin.read()
""")


def start_claimer(pg_dsn: str, schema: str, claims: Path) -> tuple[subprocess.Popen[str], int | None]:
    # TMPDIR gives these processes a claims folder of their own: other commitline processes on this
    # machine (another test's CLI, a bench) cannot take a CPU from under the assertions.
    env = {**os.environ, "TMPDIR": str(claims), "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-c", _CLAIMER, pg_dsn, schema], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line:
        proc.kill()
        pytest.fail(f"the claiming process ended before saying its CPU (exit code {proc.wait()})")
    return proc, None if line == "None" else int(line)


def test_auto_processes_claim_distinct_cpus_and_a_killed_ones_cpu_is_claimed_again(
        pg_dsn: str, schema: str, tmp_path: Path) -> None:
    first, first_cpu = start_claimer(pg_dsn, schema, tmp_path)
    second, second_cpu = start_claimer(pg_dsn, schema, tmp_path)
    third: subprocess.Popen[str] | None = None
    try:
        if len(USABLE) < 2:  # nothing to spread over: auto leaves every thread free
            assert first_cpu is None and second_cpu is None
            return
        assert {first_cpu, second_cpu} <= USABLE
        assert first_cpu != second_cpu, "two processes must not share a CPU while another is free"
        if len(USABLE) == 2:  # every CPU claimed: one more process still gets one, shared
            extra, extra_cpu = start_claimer(pg_dsn, schema, tmp_path)
            extra.communicate("", timeout=60)
            assert extra_cpu in USABLE and extra.returncode == 0
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        third, third_cpu = start_claimer(pg_dsn, schema, tmp_path)
        assert third_cpu == first_cpu, "the killed process's CPU must be free again"
    finally:
        for proc in (first, second, third):
            if proc is not None and proc.poll() is None:
                proc.communicate("", timeout=60)  # stdin closed: it closes the app and ends
