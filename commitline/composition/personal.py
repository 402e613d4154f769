"""The operator's work on personal data, as ``Commitline`` does it for the CLI: erasing a data subject (and
recomputing the read models that may have copied its values), listing erasures, rotating the master key.
``PersonalDataOperations`` is a part of ``Commitline`` (``root.py``), over its datastore, settings, store,
domain and projections.

Which read models may copy personal values is known from the domain alone (``Domain.personal_projections``):
those handling an event type with a ``Personal`` field. Erasing rebuilds them by default, so the erasure is
complete when the call returns; ``rebuild=False`` (``--no-rebuild``) leaves that to one later rebuild, for a
batch of erasures, and the report names the read models and the command that recomputes them."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from commitline.application.boundary import check_tenant
from commitline.application.errors import CommitlineError, ConfigurationError, StoreUnavailable
from commitline.domain.errors import InvalidValue
from commitline.infrastructure.personal.keys import DataKeys, Erasure, Rotation
from commitline.infrastructure.personal.master import MasterKey
from commitline.projections.rebuild import Progress, RebuildError, RebuildResult, RebuildRunning
from commitline.projections.storage import rebuild_command

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ErasureReport(Sequence[Erasure]):
    """What ``erase`` did: the erasures recorded (the report is their sequence: [] when the subject had no
    key), the read models that may have copied the subject's values (``read_models``: name -> the personal
    fields it receives), and those rebuilt since (``rebuilt``). ``recompute`` is the command that still has
    to run, None when nothing is left holding the subject's values."""

    tenant: str
    subject: str
    erasures: tuple[Erasure, ...]
    read_models: dict[str, tuple[str, ...]]
    rebuilt: tuple[RebuildResult, ...] = ()

    @property
    def pending(self) -> tuple[str, ...]:
        """The read models that may still show the subject's values."""
        done = {r.projection for r in self.rebuilt}
        return tuple(name for name in self.read_models if name not in done)

    @property
    def recompute(self) -> str | None:
        return rebuild_command(" ".join(self.pending), fresh=True) if self.pending else None

    @overload
    def __getitem__(self, index: int) -> Erasure: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Erasure]: ...

    def __getitem__(self, index: int | slice) -> Erasure | Sequence[Erasure]:
        return self.erasures[index]

    def __len__(self) -> int:
        return len(self.erasures)

    def __iter__(self) -> Iterator[Erasure]:
        return iter(self.erasures)


PREVIOUS = "COMMITLINE_PREVIOUS_MASTER_KEY"
#: How long an erasure waits for a rebuild of its read models that is already running, to run its own after it.
ERASURE_REBUILD_WAIT_S = 120.0


class PersonalDataOperations:
    """Erasure and key rotation (a part of ``Commitline``)."""

    def data_keys(self) -> DataKeys:
        return DataKeys(self.datastore.get_connection, self.settings.schema_name)  # type: ignore[attr-defined]

    def erase(self, tenant: str, subject: str, *, by: str = "operator", rebuild: bool = True,
              progress: Progress | None = None) -> ErasureReport:
        """Delete the data key of ``subject`` (of ``tenant``) and record the erasure: from now on its personal
        values read as ERASED everywhere. This process forgets the key and every decoded aggregate at once,
        and so do other running processes when the erasure's notification reaches them (``erasure_watch.py``).
        The report is empty when the subject has no key.

        Then, unless ``rebuild`` is False, rebuild the read models that may have copied its values, reading the
        log once (a running projector yields to the swap, as for ``projections rebuild``); they are rebuilt even
        when there was no key, so running the erasure again finishes one whose rebuild failed. A failing rebuild
        raises ``RebuildError`` with the erasure already committed (``erasures()`` lists it)."""
        tenant = check_tenant(tenant)
        if not subject or not subject.strip():
            raise InvalidValue("subject", subject, "must name a data subject")
        holding = dict(self.domain.personal_projections)  # type: ignore[attr-defined]
        if rebuild and holding:  # the rebuild opens the other subjects' values: a missing or wrong master key
            self.store.codec.personal.master()  # type: ignore[attr-defined]  # refuses it before anything is erased
        done = self.data_keys().erase(tenant, subject, by)
        self.store.forget(e.key_id for e in done)  # type: ignore[attr-defined]
        rebuilt: list[RebuildResult] = []
        if rebuild and holding:
            try:
                rebuilt = self._rebuild_after_erasure(holding, progress)
            except RebuildError as e:
                e.erased = tuple(done)
                raise
        return ErasureReport(tenant, subject, tuple(done), holding, tuple(rebuilt))

    def _rebuild_after_erasure(self, holding: dict[str, object], progress: Progress | None) -> list[RebuildResult]:
        """Rebuild the read models that may hold erased values, from the first event (``fresh``: an interrupted
        rebuild's rows, written before the erasure, may hold them). A rebuild already running (another erasure's,
        say) may have read the values before this erasure: this one waits for it to finish, then runs its own, for
        up to ``ERASURE_REBUILD_WAIT_S``; then it raises ``RebuildRunning`` (the erasure itself is committed)."""
        waiting = Retrying(retry=retry_if_exception_type(RebuildRunning),
                           stop=stop_after_delay(ERASURE_REBUILD_WAIT_S),
                           wait=wait_exponential(multiplier=0.05, max=1.0), reraise=True)
        rebuild = self.rebuild_many  # type: ignore[attr-defined]
        try:
            return waiting(rebuild, holding, progress=progress, fresh=True)  # type: ignore[no-any-return]
        except (RebuildError, StoreUnavailable, KeyboardInterrupt):
            raise
        except CommitlineError as e:  # typed: it says what is wrong (a master key that opens only some keys, say)
            raise RebuildError(str(e)) from e
        except Exception as e:  # a read model's write that fails (a defect of its code): told as a failed rebuild
            log.exception("recomputing the read models after an erasure failed")
            raise RebuildError(f"{type(e).__name__}: {e}") from e

    def erasures(self, tenant: str | None = None) -> list[Erasure]:
        return self.data_keys().erased(check_tenant(tenant) if tenant is not None else None)

    def rotate_master_key(self, new_key: str | None = None) -> Rotation:
        """Rewrap every data key under ``new_key`` (base64 of 32 bytes) with the configured master key; then
        configure ``new_key`` as ``COMMITLINE_MASTER_KEY`` everywhere, and run it again to catch keys that
        processes still on the old key made meanwhile.

        Without ``new_key``, the second step of a rolling rotation: every data key still wrapped under
        ``COMMITLINE_PREVIOUS_MASTER_KEY`` is rewrapped under ``COMMITLINE_MASTER_KEY`` (processes configured
        with both wrap new keys under the current one only); then the previous key can be dropped."""
        master = self.store.codec.personal.master()  # type: ignore[attr-defined]  # checked against the table
        if new_key is None:
            if master.previous is None:
                raise ConfigurationError(PREVIOUS, "is not set, and no new master key was given: give the new key "
                                         "on standard input (or --new-key-env), or, in a rolling rotation, configure "
                                         "the old key as COMMITLINE_PREVIOUS_MASTER_KEY and the new one as "
                                         "COMMITLINE_MASTER_KEY; nothing was rewrapped")
            return self.data_keys().rewrap(master.previous, master.current)
        try:
            new = MasterKey.parse(new_key)
        except ValueError as e:
            raise ConfigurationError("the new master key", str(e)) from None
        return self.data_keys().rewrap(master.current, new)
