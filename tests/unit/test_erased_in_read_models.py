"""Read models and erasure, without a database: the domain names the read models that receive personal fields
(unless they declare they store none), and a value read as ``ERASED`` is written to a row as
``{"erased": true}`` in a text or JSON column, as no value in a column of another type."""

from __future__ import annotations

from commitline import ERASED, Changes, Domain, Projection, RecordedEvent, Table, on
from commitline.examples import domain as examples
import orjson

from commitline.projections.storage import _upsert_arrays, _upsert_json
from tests.domains import customers


def test_the_domain_names_the_read_models_that_receive_personal_fields() -> None:
    assert dict(customers.domain.check().personal_projections) == {"customer_contacts": ("CustomerRegistered.email",)}
    # payment_states receives PaymentCreated.account and declares that it stores none of it
    assert examples.check().projections["payment_states"].copies_personal_data is False
    assert dict(examples.check().personal_projections) == {}


def test_a_read_model_handling_no_personal_field_is_not_named() -> None:
    class Closures(Projection):
        name = "closures"
        tables = (Table("rm_closures", {"customer": "uuid", "n": "bigint"}, key=("customer",), counters=("n",)),)

        @on(customers.CustomerClosed)
        def closed(self, changes: Changes, r: RecordedEvent) -> None:
            changes.add("rm_closures", (r.event.aggregate_id,), n=1)

    domain = Domain("customers_and_closures", include=[customers.domain])
    domain.read_model(Closures)
    assert dict(domain.check().personal_projections) == {"customer_contacts": ("CustomerRegistered.email",)}


TABLE = Table("rm_t", {"id": "int", "label": "text", "doc": "jsonb", "amount": "numeric", "name": "varchar(40)"},
              key=("id",))
ROWS = {(1,): {"label": ERASED, "doc": ERASED, "amount": ERASED, "name": "kept"},
        (2,): {"label": "plain", "doc": None, "amount": 3, "name": ERASED}}


def test_an_erased_value_is_written_as_the_erased_json_or_as_no_value() -> None:
    _, (document,) = _upsert_json("s", TABLE, ROWS, "")
    assert orjson.loads(document) == [{"id": 1, "label": '{"erased": true}', "doc": '{"erased": true}', "amount": None,
                                       "name": "kept"},
                                      {"id": 2, "label": "plain", "doc": None, "amount": 3, "name": '{"erased": true}'}]


def test_an_erased_value_is_written_the_same_as_arrays() -> None:
    _, params = _upsert_arrays("s", TABLE, ROWS, "")
    by_column = dict(zip(TABLE.columns, params))
    assert by_column["label"] == ['{"erased": true}', "plain"]
    assert by_column["doc"] == ['{"erased": true}', None]
    assert by_column["amount"] == [None, 3]
    assert by_column["name"] == ["kept", '{"erased": true}']
