"""A domain whose process manager does not override ``park`` (as the tutorial's first sketch): when advancing
keeps failing it records nothing, so its runner must stop at the event rather than pass over it
(``tests/integration/test_process_managers.py``). ``FAILING`` holds the loans whose payout fails for now. A
second one, ``audit_payout``, overrides ``park``, and its park fails for the loans in ``UNPARKABLE`` (a domain
error, or a plain bug): its runner must hold there too; its ``retry`` always fails with a plain bug."""

from __future__ import annotations

from uuid import UUID

from commitline import Aggregate, Command, Domain, Event, Id, ProcessManager, Stream

domain = Domain("forgetful")
FAILING: set[UUID] = set()
PAID: list[UUID] = []
UNPARKABLE: dict[UUID, Exception] = {}
AUDITED: list[UUID] = []
PARKED: list[UUID] = []


class LoanApproved(Event):
    pass


@domain.aggregate
class Loan(Aggregate):
    approved: bool = False

    EVENTS = (LoanApproved,)

    def _evolve(self, event: Event) -> None:
        self.approved = True


class ApproveLoan(Command):
    loan_id: Id


@domain.handles(ApproveLoan, Loan, Stream.NEW, id="loan_id")
def approve(loan: Loan, cmd: ApproveLoan) -> None:
    loan._emit(LoanApproved)


@domain.process_manager
class Payout(ProcessManager):
    name = "payout"
    triggers = (LoanApproved,)

    def advance(self, instance_id: UUID, tenant: str) -> str:
        if instance_id in FAILING:
            raise RuntimeError(f"the bank refused loan {instance_id}")
        PAID.append(instance_id)
        return "PAID"


@domain.process_manager
class AuditPayout(ProcessManager):
    name = "audit_payout"
    triggers = (LoanApproved,)

    def advance(self, instance_id: UUID, tenant: str) -> str:
        if instance_id in FAILING:
            raise RuntimeError(f"the auditor refused loan {instance_id}")
        AUDITED.append(instance_id)
        return "AUDITED"

    def park(self, instance_id: UUID, reason: str, attempts: int, tenant: str) -> None:
        if instance_id in UNPARKABLE:
            raise UNPARKABLE[instance_id]
        PARKED.append(instance_id)

    def retry(self, instance_id: UUID, tenant: str, key: str) -> str:
        raise RuntimeError(f"the auditor's retry endpoint is down (loan {instance_id})")

