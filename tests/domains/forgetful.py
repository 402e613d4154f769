"""A domain whose process manager does not override ``park`` (as the tutorial's first sketch): when advancing
keeps failing it records nothing, so its runner must stop at the event rather than pass over it
(``tests/integration/test_process_managers.py``). ``FAILING`` holds the loans whose payout fails for now."""

from __future__ import annotations

from uuid import UUID

from commitline import Aggregate, Command, Domain, Event, Id, ProcessManager, Stream

domain = Domain("forgetful")
FAILING: set[UUID] = set()
PAID: list[UUID] = []


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
