"""A Kafka client that cannot start (the broker refuses connections) is closed all the same: an outage retried
every few seconds must not leave an unclosed client behind each retry (aiokafka reports each one as an ERROR)."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket

import pytest
from aiokafka.errors import KafkaError

from commitline.infrastructure.config import Settings
from commitline.infrastructure.kafka.broker_check import last_records
from commitline.infrastructure.kafka.producer import ensure_topics, holds_records


def closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: connections to it are refused at once
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("call", [last_records, holds_records, ensure_topics],
                         ids=["broker_check.last_records", "holds_records", "ensure_topics"])
def test_a_client_whose_start_fails_is_closed(call, caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(kafka_bootstrap_servers=f"127.0.0.1:{closed_port()}")

    async def attempt() -> None:
        with pytest.raises(KafkaError):
            await call(settings, ["commitline.Nothing"])
        gc.collect()  # an unclosed client reports itself as it is collected, on this loop
        await asyncio.sleep(0)

    with caplog.at_level(logging.ERROR):
        asyncio.run(attempt())
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()], caplog.text
