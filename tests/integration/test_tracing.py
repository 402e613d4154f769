"""One trace per command, across real processes: ``commitline serve`` (HTTP request -> dispatch -> append,
linked to its group-commit batch) and ``commitline publish`` (the record's publish span, whose
``traceparent`` travels in the Kafka record's headers, read back by an independent client). Spans go to a
real OTLP/HTTP receiver started by the test; none carries a key or a payload. And off by default."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from commitline.composition import bootstrap
from commitline.infrastructure.kafka.envelope import topic_for
from tests.integration.http.conftest import start_server
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.support import settings_for, wait_for

SERVER, PRODUCER = 2, 4  # OTLP span kinds
PAYMENT = {"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": "acc-traced-payload"}


def kafka_records(bootstrap_servers: str, topic: str) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"reader-{uuid.uuid4()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        partitions = consumer.list_topics(topic, timeout=20).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records: list[Any] = []

        def one() -> Any:
            records.extend(m for m in consumer.consume(num_messages=100, timeout=0.5) if not m.error())
            return records or None

        return wait_for(one, f"a record on {topic}", timeout=60)
    finally:
        consumer.close()


def test_one_trace_follows_a_command_from_http_to_the_kafka_record(pg_dsn: str, schema: str, kafka_bootstrap: str,
                                                                   tmp_path: Path) -> None:
    with OtlpReceiver() as otlp:
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, "OTEL_SERVICE_NAME": "payments-api",
                "OTEL_BSP_SCHEDULE_DELAY": "100"}
        server = start_server(pg_dsn, schema, tmp_path / "serve.log", **otel)
        try:
            acme = server.client("acme")
            api_key, idempotency_key = server.key("acme"), f"key-{uuid.uuid4()}"
            created = acme.post("/v1/commands", json=PAYMENT, headers={"Idempotency-Key": idempotency_key})
            assert created.status_code == 201, created.text
            reused = acme.post("/v1/commands", json={**PAYMENT, "amount": "13.00"},
                               headers={"Idempotency-Key": idempotency_key})
            assert reused.status_code == 422 and reused.json()["code"] == "idempotency_key_reused"
            # a key pasted into a URL (a client's mistake) is redacted in the span as in the access log, and a
            # span is named after its route, not after the id it was asked for
            pasted = acme.get(f"/v1/aggregates/{uuid.uuid4()}", params={"token": api_key})
            assert pasted.status_code == 400  # no such parameter: refused, the key still in the URL
            stray = acme.get(f"/v1/no-such-place/{api_key}")
            assert stray.status_code == 404
        finally:
            assert server.stop() == 0, server.output()
        payment = created.json()["aggregate_id"]

        publish = subprocess.run(
            [sys.executable, "-m", "commitline.cli", "publish", "--drain"], capture_output=True, text=True,
            timeout=180, env={**server.env, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                              "COMMITLINE_KAFKA_IDEMPOTENCE": "false", "COMMITLINE_KAFKA_TOPIC_PREFIX": f"{schema}."})
        assert publish.returncode == 0, publish.stderr[-3000:]
        (record,) = [m for m in kafka_records(kafka_bootstrap, topic_for(f"{schema}.", "PaymentTransaction"))
                     if m.key().decode() == payment]
        traceparent = dict(record.headers())["traceparent"].decode()
        _, trace_id, publish_span_id, _ = traceparent.split("-")

        def whole_trace() -> list[ReceivedSpan] | None:
            spans = [s for s in otlp.received() if s.trace_id == trace_id]
            return spans if any(s.kind == PRODUCER for s in spans) and any(s.kind == SERVER for s in spans) else None

        spans = wait_for(whole_trace, f"the spans of trace {trace_id} at the OTLP receiver", timeout=60)
        by_id = {s.span_id: s for s in spans}
        (http,) = [s for s in spans if s.kind == SERVER]
        (dispatch,) = [s for s in spans if s.name == "dispatch create_payment"]
        (append,) = [s for s in spans if s.name == "append"]
        (published,) = [s for s in spans if s.kind == PRODUCER]
        assert http.name.startswith("POST") and http.service == "payments-api"
        assert dispatch.parent_span_id == http.span_id
        assert dispatch.attributes == {"commitline.tenant": "acme", "commitline.command.type": "create_payment",
                                       "commitline.outcome": "applied"}
        assert append.parent_span_id == dispatch.span_id and append.attributes["commitline.events"] == 1
        assert published.parent_span_id == append.span_id and published.span_id == publish_span_id
        assert published.name == f"publish {schema}.PaymentTransaction"
        assert published.attributes["messaging.system"] == "kafka"
        assert published.attributes["messaging.destination.name"] == f"{schema}.PaymentTransaction"
        assert set(by_id) == {http.span_id, dispatch.span_id, append.span_id, published.span_id}

        (batch_link,) = append.links  # the group-commit batch it joined: a trace of its own, linked both ways
        batches = {(s.trace_id, s.span_id): s for s in otlp.received() if s.name == "group commit"}
        batch = batches[batch_link]
        assert (append.trace_id, append.span_id) in batch.links
        assert batch.attributes["commitline.batch.commands"] >= 1

        (refused,) = [s for s in otlp.received() if s.name == "dispatch create_payment" and s is not dispatch
                      and s.attributes.get("commitline.outcome") == "refused"]
        assert refused.attributes["commitline.error.code"] == "idempotency_key_reused"

        secrets = (api_key, idempotency_key, PAYMENT["account"], "13.00")
        for span in otlp.received():
            assert api_key not in span.name, span.name
            for value in span.attributes.values():
                assert not any(secret in str(value) for secret in secrets), f"{span.name} records {value!r}"
        def gets() -> list[ReceivedSpan] | None:
            found = [s for s in otlp.received() if s.kind == SERVER and s.attributes.get("http.route") in (
                "/v1/aggregates/{aggregate_id}", "unmatched")]
            return found if len(found) >= 2 else None

        reads = wait_for(gets, "the two GET requests' spans", timeout=60)
        assert sorted(s.name for s in reads) == ["GET /v1/aggregates/{aggregate_id}", "GET unmatched"]
        assert any("clk_<redacted>" in str(v) for s in reads for v in s.attributes.values())
        assert http.name == "POST /v1/commands" and http.attributes.get("http.route") == "/v1/commands"


def test_tracing_is_off_by_default(pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        assert app.tracing is None and app.processor.tracing is None and app.store.tracing is None
        app.dispatch(PAYMENT, idempotency_key="untraced")
        with psycopg.connect(pg_dsn) as conn:
            (state,) = conn.execute(f'SELECT state FROM "{schema}".events').fetchone()
        assert "tp" not in orjson.loads(bytes(state)), "nothing of a trace is stored without tracing"


def test_an_otlp_protocol_commitline_cannot_export_stops_at_start(pg_dsn: str, schema: str) -> None:
    out = subprocess.run([sys.executable, "-m", "commitline.cli", "status"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
                                           "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                                           "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert out.returncode == 3
    assert orjson.loads(out.stderr)["code"] == "configuration_error" and "OTEL_EXPORTER_OTLP_PROTOCOL" in out.stderr


def test_a_request_is_traced_whatever_its_host_and_a_command_run_again_is_no_error(pg_dsn: str, schema: str,
                                                                                    tmp_path: Path) -> None:
    """The caller's trace goes on whatever host it asked for (the probes' exclusion is of their paths only, not
    of a host such as ``payments-static``); captured headers never show an API key, whichever header carries it;
    and an append whose stream moved (the command runs again and succeeds) is not marked as an error."""
    with OtlpReceiver() as otlp:
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
                "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST": ".*"}
        server = start_server(pg_dsn, schema, tmp_path / "serve.log", **otel)
        try:
            acme, api_key = server.client("acme"), server.key("acme")
            item, trace_id, parent = str(uuid.uuid4()), uuid.uuid4().hex, "1" * 16

            def receive(key: str, **headers: str) -> int:
                return acme.post("/v1/commands", json={"type": "receive_stock", "item_id": item, "quantity": 1},
                                 headers={"Idempotency-Key": key, **headers}).status_code

            assert receive(f"k-{uuid.uuid4()}", Host="payments-static.example.com", **{
                "traceparent": f"00-{trace_id}-{parent}-01", "X-Api-Key": api_key}) in (200, 201)
            for path in ("/healthz", "/readyz", "/metrics"):
                assert acme.get(path).status_code == 200

            def ran_again() -> bool:  # concurrent commands on one stream: some meet a moved stream and run again
                with ThreadPoolExecutor(16) as pool:
                    assert set(pool.map(lambda i: receive(f"k-{uuid.uuid4()}"), range(16))) == {200}
                appends = [s for s in otlp.received() if s.name == "append"]
                dispatches = [s for s in otlp.received() if s.name == "dispatch receive_stock"]
                return len(appends) > len(dispatches)

            wait_for(ran_again, "a command to run again after its stream moved", timeout=120)
        finally:
            assert server.stop() == 0, server.output()
        (http,) = wait_for(lambda: [s for s in otlp.received() if s.trace_id == trace_id and s.kind == SERVER],
                           "the request's span in the caller's trace")
        assert http.parent_span_id == parent and http.name == "POST /v1/commands"
        captured = [name for name in http.attributes if name.startswith("http.request.header.")]
        assert "http.request.header.x_api_key" in captured, captured
        for span in otlp.received():
            assert not any(api_key in str(value) for value in span.attributes.values()), span
            assert not any(probe in span.name for probe in ("healthz", "readyz", "metrics")), span.name
            if span.name in ("append", "dispatch receive_stock"):
                assert span.status_code != 2, f"{span.name} marked as an error: {span}"
