"""The ``personal_data`` benchmark's domain, built twice: ``SEALED`` declares the holder's email personal,
``PLAIN`` is the same domain with the same field not declared so. Nothing else differs, so any gap between
their figures is the cost of sealing and opening the field (and of the data keys).

A ``Holder`` is its own data subject (its ``holder`` is its id, as a payment is its own holder):

- ``open_holder`` (a new stream): ``HolderOpened(email)``, and for ``SEALED`` a new data key;
- ``change_email`` (an existing stream): ``EmailChanged(email)`` under the key the holder has;
- read model ``holder_emails``: holders per domain (the part after ``@``) of the email they opened with, and
  per holder its email's length and its changes, so every event it handles is opened.

This module is written without ``from __future__ import annotations``: the email's annotation is chosen when
``build`` runs, and must be an object then, not a name looked up later in this module's globals.
"""

from dataclasses import dataclass
from typing import Annotated

from commitline import Aggregate, Changes, Command, Domain, Event, Id, NonBlankText, Personal, Projection, \
    RecordedEvent, Stream, Table, on


@dataclass(frozen=True)
class BenchDomain:
    """One build of the domain, with the classes a benchmark writes and loads directly."""

    domain: Domain
    holder: type[Aggregate]
    opened: type[Event]
    changed: type[Event]


def build(personal: bool) -> BenchDomain:
    """The bench domain, its email personal (subject: the holder) or not."""
    Email = Annotated[str, Personal(subject="holder")] if personal else str  # noqa: N806 (a type)

    class HolderOpened(Event):
        email: Email

    class EmailChanged(Event):
        email: Email

    domain = Domain("bench_sealed" if personal else "bench_plain")

    @domain.aggregate
    class Holder(Aggregate):
        email: str = ""
        changes: int = 0

        EVENTS = (HolderOpened, EmailChanged)

        @property
        def holder(self) -> str:
            """The data subject of the email: the holder's id."""
            return str(self.id)

        def _evolve(self, event: Event) -> None:
            match event:
                case HolderOpened(email=email):
                    self.email = email
                case EmailChanged(email=email):
                    self.email, self.changes = email, self.changes + 1

    class OpenHolder(Command):
        holder_id: Id
        email: NonBlankText

    class ChangeEmail(Command):
        holder_id: Id
        email: NonBlankText

    @domain.handles(OpenHolder, Holder, Stream.NEW, id="holder_id")
    def open_holder(h: Holder, cmd: OpenHolder) -> Holder:
        h._emit(HolderOpened, email=cmd.email)
        return h

    @domain.handles(ChangeEmail, Holder, id="holder_id")
    def change_email(h: Holder, cmd: ChangeEmail) -> None:
        h._emit(EmailChanged, email=cmd.email)

    @domain.read_model
    class HolderEmails(Projection):
        """Holders per (tenant, email domain), and each holder's email length and changes."""

        name = "holder_emails"
        tables = (
            Table("rm_holders", {"holder_id": "uuid", "email_length": "integer", "changes": "bigint"},
                  key=("holder_id",), counters=("changes",)),
            Table("rm_email_domains", {"tenant": "text", "email_domain": "text", "holders": "bigint"},
                  key=("tenant", "email_domain"), counters=("holders",)),
        )

        @on(HolderOpened)
        def opened(self, changes: Changes, r: RecordedEvent) -> None:
            email = r.event.email
            changes.put("rm_holders", (r.event.aggregate_id,), email_length=_length(email))
            changes.add("rm_email_domains", (r.tenant, _email_domain(email)), holders=1)

        @on(EmailChanged)
        def changed(self, changes: Changes, r: RecordedEvent) -> None:
            changes.put("rm_holders", (r.event.aggregate_id,), email_length=_length(r.event.email))
            changes.add("rm_holders", (r.event.aggregate_id,), changes=1)

    return BenchDomain(domain, Holder, HolderOpened, EmailChanged)


def _length(email: object) -> int | None:
    """An erased email (``ERASED``, once the erasure's rebuild replays it) has no length."""
    return len(email) if isinstance(email, str) else None


def _email_domain(email: object) -> str:
    return email.rpartition("@")[2] if isinstance(email, str) else "(erased)"


SEALED = build(personal=True)
PLAIN = build(personal=False)
