"""``CommandProcessor.dispatch``: validate, then deduplicate, load, decide, append, exactly once.

Validation (the boundary, then pydantic, the key and the tenant) raises before any I/O; the validated
command then goes its way to its one answer in ``dispatching.Dispatch``, whose docstring lists the
exactly-once rules (key lookup, load, decide, append, conflict re-run, twin wait, replay, tenants) and the
step that keeps each.

``dispatch_many``: a batch caller's commands (the CLI's stdin), each dispatched exactly as by ``dispatch``
and atomic on its own, several at once so that their appends share group-commit transactions. The
commands run in waves of mutually independent ones, in input order: a command that touches an
aggregate id or an idempotency key an earlier command of the wave touches starts a new wave, which
begins only when the previous one has finished. So every result is the one sequential dispatching
would give.

Observing: every dispatch reports its outcome once to the processor's ``DispatchObserver`` (applied,
replayed, refused with the error's code, or failed), with its duration, and each re-run after the stream
moved as a retry. The default observer does nothing; composition wires the Prometheus one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, Protocol
from uuid import UUID

from commitline.application.boundary import CommandLimits, check_idempotency_key, check_tenant, idempotency_key_or_none
from commitline.application.catalog import CommandCatalog
from commitline.application.commands import Command, parse_command
from commitline.application.dispatching import Dispatch, derived_id
from commitline.application.errors import (CommitlineError, ConfigurationError, HistoryBroken, InvalidCommand,
                                           StoreUnavailable, UnexpectedFailure)
from commitline.application.ports import EventStore, IdempotencyRecordBroken
from commitline.application.results import DispatchResult
from commitline.application.retry import RetryPolicy


log = logging.getLogger(__name__)


def _nothing() -> None:
    pass


APPLIED, REPLAYED, REFUSED, FAILED = "applied", "replayed", "refused", "failed"
UNKNOWN_TYPE = "unknown"  # the type reported for a command whose type is not one of the domain's


class DispatchObserver:
    """What ``dispatch`` reports (for metrics): each outcome once, and each re-run after the stream moved.
    This one ignores everything; an implementation must be cheap and must not raise.

    ``command_type`` is always one of the domain's command types or ``"unknown"`` (never text from the caller);
    ``outcome`` is ``applied``, ``replayed``, ``refused`` (a typed refusal: ``code`` says which) or
    ``failed`` (the store or the configuration failed, or an unexpected error: ``code`` says which)."""

    def on_retry(self, command_type: str) -> None:
        pass

    def on_outcome(self, command_type: str, outcome: str, code: str | None, seconds: float) -> None:
        pass


class DispatchTracing(Protocol):
    """Traces of dispatches (``infrastructure/tracing.py``): a span current while the command runs, and the
    observer (wrapping ``observer``) that writes the outcome on it. None on the processor: no tracing at all."""

    def dispatch(self, tenant: object, observer: DispatchObserver) -> AbstractContextManager[DispatchObserver]: ...


def _reported_type(catalog: CommandCatalog, command: object, error: BaseException | None = None) -> str:
    """The command's type if it is one of ``catalog``'s, else ``unknown``."""
    name = command.type if isinstance(command, Command) else getattr(error, "command_type", None)
    if name is None and isinstance(command, Mapping):
        name = command.get("type")
    return name if isinstance(name, str) and name in catalog.known_types else UNKNOWN_TYPE


class CommandProcessor:
    def __init__(self, store: EventStore, catalog: CommandCatalog, retry: RetryPolicy | None = None,
                 limits: CommandLimits | None = None, observer: DispatchObserver | None = None,
                 enter_thread: Callable[[], None] | None = None, tracing: DispatchTracing | None = None):
        self.store = store
        self.catalog = catalog
        self.retry = retry or RetryPolicy()
        self.limits = limits or CommandLimits()
        self.observer = observer or DispatchObserver()
        self.enter_thread = enter_thread or _nothing  # run by the dispatching thread first (e.g. its CPU)
        self.tracing = tracing

    def dispatch(
        self,
        command: Command | Mapping[str, Any] | str | bytes,
        *,
        idempotency_key: str | None,
        tenant: str = "default",
    ) -> DispatchResult:
        return self._observed(command, None, idempotency_key, tenant)

    def dispatch_many(self, items: Sequence[tuple[Command | Mapping[str, Any] | str | bytes, str | None, str]], *,
                      concurrency: int = 32) -> list[DispatchResult | CommitlineError]:
        """Dispatch each (command, idempotency_key, tenant); per item its result or its typed error, in order.

        A command that fails with an exception that is no commitline error (a defect) is logged with its
        traceback and answered ``UnexpectedFailure``; the others' outcomes are kept (they may have committed)."""
        outcomes: list[DispatchResult | CommitlineError | None] = [None] * len(items)
        wave: list[tuple[int, Command]] = []
        touched: set[object] = set()
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(items))),
                                thread_name_prefix="dispatch-many") as pool:
            for index, (command, key, tenant) in enumerate(items):
                try:
                    cmd = parse_command(command, self.catalog, limits=self.limits)
                except CommitlineError:  # refused before any I/O: dispatch reports it as usual
                    outcomes[index] = self._outcome(command, None, key, tenant)
                    continue
                tokens = self._touches(cmd, key, tenant)
                if not touched.isdisjoint(tokens):
                    self._run_wave(pool, wave, items, outcomes)
                    wave, touched = [], set()
                wave.append((index, cmd))
                touched.update(tokens)
            self._run_wave(pool, wave, items, outcomes)
        return outcomes  # type: ignore[return-value]  # every item has its outcome

    def _run_wave(self, pool: ThreadPoolExecutor, wave: list[tuple[int, Command]],
                  items: Sequence[tuple[Any, str | None, str]],
                  outcomes: list[DispatchResult | CommitlineError | None]) -> None:
        if len(wave) == 1:  # nothing to overlap with: no hand-over to a thread
            index, cmd = wave[0]
            outcomes[index] = self._outcome(items[index][0], cmd, items[index][1], items[index][2])
            return
        futures = [(index, pool.submit(self._outcome, items[index][0], cmd, items[index][1], items[index][2]))
                   for index, cmd in wave]
        for index, future in futures:  # result() re-raises an unexpected error, after the whole wave is done
            outcomes[index] = future.result()

    def _outcome(self, command: Any, cmd: Command | None, key: str | None,
                 tenant: str) -> DispatchResult | CommitlineError:
        try:
            return self._observed(command, cmd, key, tenant)
        except CommitlineError as e:
            return e
        except IdempotencyRecordBroken:
            raise  # the store's fault, not the command's: the caller stops (``commitline dispatch`` exits 3)
        except Exception as e:
            command_type = cmd.type if cmd is not None else _reported_type(self.catalog, command)
            log.error("%s (idempotency key given: %s) failed unexpectedly", command_type, key is not None,
                      exc_info=e)
            return UnexpectedFailure(command_type, type(e).__name__)

    def _touches(self, cmd: Command, key: object, tenant: object) -> set[object]:
        """What a command may read or write: every id it names, its target stream (derived ids included)
        and its (tenant, key). Only hashable text is used: an unusable key or tenant is refused anyway."""
        tokens: set[object] = {value for _, value in cmd if isinstance(value, UUID)}
        tokens.add(("key", tenant if isinstance(tenant, str) else None, idempotency_key_or_none(key)))
        target = self.catalog.handler(type(cmd)).target(cmd)
        if target is not None:
            tokens.add(target)
        elif (usable := idempotency_key_or_none(key)) is not None and isinstance(tenant, str):
            tokens.add(derived_id(tenant, usable))
        return tokens

    def _observed(self, command: Any, cmd: Command | None, idempotency_key: str | None,
                  tenant: str) -> DispatchResult:
        self.enter_thread()
        if self.tracing is None:
            return self._reported(self.observer, command, cmd, idempotency_key, tenant)
        with self.tracing.dispatch(tenant, self.observer) as observer:
            return self._reported(observer, command, cmd, idempotency_key, tenant)

    def _reported(self, observer: DispatchObserver, command: Any, cmd: Command | None, idempotency_key: str | None,
                  tenant: str) -> DispatchResult:
        started, command_type = time.perf_counter(), None
        try:
            if cmd is None:
                cmd = parse_command(command, self.catalog, limits=self.limits)
            command_type = cmd.type
            result = self._dispatch(cmd, idempotency_key, tenant, observer)
        except CommitlineError as e:
            failed = isinstance(e, (StoreUnavailable, ConfigurationError, HistoryBroken))  # not the command's fault
            code = "malformed_json" if isinstance(e, InvalidCommand) and e.not_json else e.code  # as HTTP answers
            observer.on_outcome(command_type or _reported_type(self.catalog, command, e), FAILED if failed else REFUSED,
                                code, time.perf_counter() - started)
            raise
        except Exception:
            observer.on_outcome(command_type or _reported_type(self.catalog, command), FAILED, "internal_error",
                                time.perf_counter() - started)
            raise
        observer.on_outcome(command_type, REPLAYED if result.replayed else APPLIED, None,
                            time.perf_counter() - started)
        return result

    def _dispatch(self, cmd: Command, idempotency_key: str | None, tenant: str,
                  observer: DispatchObserver) -> DispatchResult:
        key = check_idempotency_key(idempotency_key, cmd.type)
        tenant = check_tenant(tenant)
        return Dispatch(self.store, observer, self.catalog.handler(type(cmd)), cmd, tenant, key).run(self.retry)
