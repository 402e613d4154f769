"""A domain whose own code quotes a personal value in every error it raises, as careless code does: the
command handler refuses an email on its blocked list with ``InvalidValue`` (value included), the read model
``contact_mailboxes`` fails on a "poison" email with the email in its message, and the process manager
``greeter`` fails on a "saga-fails" email the same way, then parks the contact with the reason it is given.
Used by tests/integration/test_plaintext_places.py: commitline must keep those values out of what it writes
(answers, logs, traces, follower records, parked reasons)."""

from __future__ import annotations

import logging
from typing import Annotated
from uuid import UUID

from commitline import (
    Aggregate,
    Changes,
    Command,
    Domain,
    Event,
    Id,
    InvalidValue,
    NonBlankText,
    Personal,
    ProcessManager,
    Projection,
    RecordedEvent,
    Stream,
    Table,
    on,
)

log = logging.getLogger(__name__)


class ContactAdded(Event):
    contact_id: str
    email: Annotated[str, Personal(subject="contact_id")]


class GreetingParked(Event):
    reason: str
    attempts: int


domain = Domain("careless")


@domain.aggregate
class Contact(Aggregate):
    contact_id: str = ""
    email: str = ""
    parked: str | None = None

    EVENTS = (ContactAdded, GreetingParked)

    def _evolve(self, event: Event) -> None:
        match event:
            case ContactAdded(contact_id=contact_id, email=email):
                self.contact_id, self.email = contact_id, email
            case GreetingParked(reason=reason):
                self.parked = reason


class AddContact(Command):
    contact_id: NonBlankText
    email: NonBlankText


class ParkGreeting(Command):
    contact: Id
    reason: str
    attempts: int


@domain.handles(AddContact, Contact, Stream.NEW)
def add(c: Contact, cmd: AddContact) -> Contact:
    if cmd.email.startswith("blocked-"):
        raise InvalidValue("email", cmd.email, "is on the blocked list")
    c._emit(ContactAdded, contact_id=cmd.contact_id, email=cmd.email)
    return c


@domain.handles(ParkGreeting, Contact, id="contact", internal=True)
def park(c: Contact, cmd: ParkGreeting) -> None:
    c._emit(GreetingParked, reason=cmd.reason, attempts=cmd.attempts)


@domain.read_model
class ContactMailboxes(Projection):
    """Each contact's id: it receives the email, stores none of it, and fails on a poison one."""

    name = "contact_mailboxes"
    copies_personal_data = False
    tables = (Table("rm_contact_mailboxes", {"contact": "uuid", "contact_id": "text"}, key=("contact",)),)

    @on(ContactAdded)
    def added(self, changes: Changes, r: RecordedEvent) -> None:
        e = r.event
        if e.email.startswith("poison-"):
            raise ValueError(f"no mailbox for {e.email}")
        changes.put("rm_contact_mailboxes", (e.aggregate_id,), contact_id=e.contact_id)


@domain.process_manager
class Greeter(ProcessManager):
    """Greets each new contact; cannot greet a "saga-fails" one, and parks it with the reason it is given."""

    name = "greeter"
    triggers = (ContactAdded,)

    def advance(self, instance_id: UUID, tenant: str) -> str:
        contact = self.load(Contact, instance_id, tenant)
        if contact.parked is not None:
            return "PARKED"
        if contact.email.startswith("saga-fails-"):
            raise RuntimeError(f"cannot greet {contact.email}")
        return "GREETED"

    def park(self, instance_id: UUID, reason: str, attempts: int, tenant: str) -> None:
        log.critical("greeting %s is PARKED after %d attempts: %s", instance_id, attempts, reason)
        self.dispatch(ParkGreeting(contact=instance_id, reason=reason, attempts=attempts), f"park/{instance_id}",
                      tenant)
