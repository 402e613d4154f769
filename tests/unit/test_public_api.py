"""The public API is one import surface, ``from commitline import ...`` (and ``commitline.testing``): every name it
exports resolves, and the pure building blocks come without the database and Kafka clients."""

from __future__ import annotations

import subprocess
import sys

import commitline


def test_every_exported_name_resolves() -> None:
    for name in commitline.__all__:
        assert getattr(commitline, name) is not None, name
    assert set(commitline.__all__) <= set(dir(commitline))
    assert {"Domain", "Aggregate", "Event", "Command", "Stream", "transitions", "Projection", "Table", "on",
            "ProcessManager", "DomainError", "bootstrap", "Reads", "RecordedEvent"} <= set(commitline.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        commitline.NoSuchThing  # noqa: B018
    except AttributeError as e:
        assert "NoSuchThing" in str(e)
    else:
        raise AssertionError("an unknown name must not resolve")


def test_the_domain_building_blocks_load_no_database_or_kafka_client() -> None:
    code = ("import sys; from commitline import Aggregate, Event, transitions, DomainError; "
            "print(sorted(m for m in ('psycopg', 'aiokafka', 'eventsourcing', 'fastapi') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_every_error_commitline_raises_is_importable_from_commitline() -> None:
    import inspect

    import commitline.application.errors as application_errors
    import commitline.domain.errors as domain_errors

    errors = {name for module in (application_errors, domain_errors) for name, value in vars(module).items()
              if inspect.isclass(value) and issubclass(value, commitline.CommitlineError)
              and value.__module__ == module.__name__}
    assert errors - set(commitline.__all__) == set()
    assert "IdempotencyRecordBroken" in commitline.__all__  # the store's fault, raised by dispatch too
