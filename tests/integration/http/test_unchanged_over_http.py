"""A command that changes nothing, over HTTP from a real ``commitline serve`` running a team's domain: 200 with no
events at the stream's version, and a retry with the same key replays that answer."""

from __future__ import annotations

from pathlib import Path
from uuid import uuid4

from tests.integration.http.conftest import start_server


def test_a_command_that_changes_nothing_answers_200_with_no_events(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    server = start_server(pg_dsn, schema, tmp_path / "serve.log", COMMITLINE_APP="tests.domains.quiet:domain")
    try:
        client, lamp = server.client("acme"), str(uuid4())
        switched = client.post("/v1/commands", json={"type": "switch", "lamp_id": lamp, "on": True},
                               headers={"Idempotency-Key": "on-1"})
        assert switched.status_code == 201, switched.text
        for attempt in ("first", "retry"):
            same = client.post("/v1/commands", json={"type": "switch", "lamp_id": lamp, "on": True},
                               headers={"Idempotency-Key": "on-2"})
            assert same.status_code == 200, (attempt, same.text)
            body = same.json()
            assert (body["events"], body["version"], body["aggregate_type"]) == ([], 1, "Lamp"), body
            assert (same.headers.get("Idempotent-Replayed") == "true") == (attempt == "retry"), same.headers
    finally:
        server.stop()
