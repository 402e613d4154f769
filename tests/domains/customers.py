"""A domain whose personal field names its data subject by a field of the event: a customer registered under
the team's own customer id, with an email. Used by the personal-data tests: two tenants may each have a
customer ``c-1``, and erasing one must leave the other's email readable. Its read model ``customer_contacts``
copies the email into its rows, as a team's contact list would: erasing must recompute it."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from commitline import (
    Aggregate,
    Changes,
    Command,
    Domain,
    Event,
    Id,
    NonBlankText,
    Personal,
    Projection,
    RecordedEvent,
    Stream,
    Table,
    on,
    transitions,
)


class CustomerState(str, Enum):
    ACTIVE = "ACTIVE"
    CLOSED = "CLOSED"


class CustomerRegistered(Event):
    customer_id: str
    email: Annotated[str, Personal(subject="customer_id")]


class CustomerClosed(Event):
    pass


domain = Domain("customers")


@domain.aggregate
class Customer(Aggregate):
    state: CustomerState | None = None
    customer_id: str = ""
    email: str = ""

    EVENTS = (CustomerRegistered, CustomerClosed)
    TRANSITIONS = transitions({CustomerState.ACTIVE: {CustomerState.CLOSED}, CustomerState.CLOSED: set()})

    def _evolve(self, event: Event) -> None:
        match event:
            case CustomerRegistered(customer_id=customer_id, email=email):
                self.state, self.customer_id, self.email = CustomerState.ACTIVE, customer_id, email
            case CustomerClosed():
                self.state = CustomerState.CLOSED


class RegisterCustomer(Command):
    customer_id: NonBlankText
    email: NonBlankText


class CloseCustomer(Command):
    customer: Id


@domain.handles(RegisterCustomer, Customer, Stream.NEW)
def register(c: Customer, cmd: RegisterCustomer) -> Customer:
    c._emit(CustomerRegistered, customer_id=cmd.customer_id, email=cmd.email)
    return c


@domain.handles(CloseCustomer, Customer, id="customer")
def close(c: Customer, cmd: CloseCustomer) -> None:
    c._move(CustomerState.CLOSED, CustomerClosed)


@domain.read_model
class CustomerContacts(Projection):
    """Each customer's email and state: a copy of a personal field."""

    name = "customer_contacts"
    tables = (Table("rm_customer_contacts", {"customer": "uuid", "tenant": "text", "customer_id": "text",
                                             "email": "text", "state": "text"}, key=("customer",)),
              # keyed by the personal value itself: an erased subject's row must go, not merge with others'
              Table("rm_customers_by_email", {"tenant": "text", "email": "text", "customer": "uuid"},
                    key=("tenant", "email")))

    @on(CustomerRegistered)
    def registered(self, changes: Changes, r: RecordedEvent) -> None:
        e = r.event
        changes.put("rm_customer_contacts", (e.aggregate_id,), tenant=r.tenant, customer_id=e.customer_id,
                    email=e.email, state=CustomerState.ACTIVE.value)
        changes.put("rm_customers_by_email", (r.tenant, e.email), customer=e.aggregate_id)

    @on(CustomerClosed)
    def closed(self, changes: Changes, r: RecordedEvent) -> None:
        changes.put("rm_customer_contacts", (r.event.aggregate_id,), state=CustomerState.CLOSED.value)
