"""The data-key table in memory, for unit tests of personal fields (what ``PersonalData`` asks of ``DataKeys``)."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from commitline.examples import domain as examples
from commitline.infrastructure.personal.cipher import PersonalData
from commitline.infrastructure.personal.keys import KeyRow
from commitline.infrastructure.personal.master import MasterKey, generate
from commitline.infrastructure.store.codec import EventCodec


class MemoryKeys:
    """``DataKeys`` in a dict: what ``PersonalData`` asks of the key table."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], KeyRow] = {}
        self.masters: list[str] = []  # the record of master keys in use

    def find_or_add(self, new: KeyRow) -> KeyRow:
        return self.rows.setdefault((new.tenant, new.subject), new)

    def claim_master(self, master_key_ids: Sequence[str]) -> str | None:
        if self.rows and not any(r.master_key_id in master_key_ids for r in self.rows.values()):
            return "no data key is wrapped under it"
        if not self.rows and self.masters and not set(master_key_ids) & set(self.masters):
            return "another master key is in use"
        if master_key_ids[0] not in self.masters:
            self.masters.append(master_key_ids[0])
        return None

    def get(self, key_id: UUID) -> KeyRow | None:
        return next((r for r in self.rows.values() if r.key_id == key_id), None)

    def erase(self, tenant: str, subject: str) -> UUID:
        return self.rows.pop((tenant, subject)).key_id


def codec(keys: MemoryKeys | None = None, master: MasterKey | None = None) -> tuple[EventCodec, MemoryKeys]:
    keys = keys or MemoryKeys()
    key = master or MasterKey.parse(generate())
    return EventCodec(examples.check().registry, PersonalData(keys, lambda: key)), keys  # type: ignore[arg-type]
