"""The HTTP status of every typed error comes from one table, and the README shows that table."""

from __future__ import annotations

import importlib
from pathlib import Path

from commitline.application import errors
from commitline.domain.errors import CommitlineError
from commitline.examples.inventory import InsufficientStock, UnknownReservation
from commitline.http.problems import STATUS, problem_document, status_markdown, status_of
from tests.support import EXAMPLES


def every_error_class(cls: type = CommitlineError) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | every_error_class(sub)
    return found


def test_every_typed_error_of_commitline_has_its_status_in_the_table() -> None:
    importlib.import_module("commitline.http.app")  # defines every HttpProblem the app raises

    own = {cls for cls in every_error_class() if cls.__module__.startswith("commitline.")
           and not cls.__module__.startswith("commitline.examples")}
    codes = {cls.code for cls in own}
    abstract = {"error", "domain_error"}
    assert codes - abstract - set(STATUS) == set(), "add these codes to STATUS in commitline/http/problems.py"


def test_a_domain_error_answers_with_the_status_it_declares() -> None:
    assert status_of(InsufficientStock("item", 3, 1)) == 409
    assert status_of(UnknownReservation("item", "r")) == 404
    assert set(EXAMPLES.error_statuses) == {"insufficient_stock", "unknown_reservation", "duplicate_reservation",
                                             "task_closed", "users_already_issued", "user_not_issued",
                                             "order_already_confirmed", "fulfilment_not_waiting"}


def test_the_errors_reference_is_generated_from_the_table() -> None:
    page = (Path(__file__).parents[2] / "docs" / "reference" / "errors.md").read_text()
    assert "<!-- generated: errors -->" in page, "the reference page must take its table from the code"
    table = status_markdown(EXAMPLES.error_statuses)
    assert "| 409 Conflict |" in table and "`insufficient_stock`" in table


def test_a_problem_document_carries_the_code_and_details() -> None:
    error = errors.ConcurrencyConflict("7b0c", 1, 2)
    document = problem_document(error, "/v1/commands")
    assert document["status"] == 409 and document["code"] == "concurrency_conflict"
    assert document["type"] == "urn:commitline:problem:concurrency_conflict"
    assert document["details"]["actual_version"] == 2 and document["actual_version"] == 2
    assert document["instance"] == "/v1/commands"


def test_an_internal_error_tells_what_a_retry_of_that_request_means() -> None:
    """A command's 500 says nothing was written and to retry with its key; a read's, that it changed nothing and
    may be sent again (it has no Idempotency-Key); any other request's, only where the cause is."""
    from commitline.http.problems import InternalError

    assert "retry with the same Idempotency-Key" in str(InternalError("POST", "/v1/commands"))
    read = str(InternalError("GET", "/v1/aggregates/5d1c3a0e-8f0b-4c55-9d1e-1f7f6a0c2b11"))
    assert "a read changes nothing" in read and "Idempotency-Key" not in read
    other = str(InternalError("POST", "/v1/subjects/erasures"))
    assert "Idempotency-Key" not in other and "nothing was written" not in other
    assert {InternalError("GET", "/v1/status").code, status_of(InternalError())} == {"internal_error", 500}
