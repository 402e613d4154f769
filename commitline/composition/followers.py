"""The followers that carry events out of the store, as ``Commitline`` builds and runs them: the Kafka
publisher (to the configured broker, or an embedded one where that is safe), reading back what it published,
running followers in threads or until a signal, and the ``/metrics`` endpoint of a process that runs them.

``Followers`` is a part of ``Commitline`` (``root.py``): its methods use the root's settings, recorder,
connection parameters, domain, tracing and liveness."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from commitline.application.errors import ConfigurationError
from commitline.infrastructure.collection import bulk_collection
from commitline.infrastructure.config import Settings
from commitline.infrastructure.embedded.kafka import EmbeddedKafka
from commitline.infrastructure.embedded.local import shared_kafka
from commitline.infrastructure.followers.engine import Follower
from commitline.infrastructure.followers.thread import FollowerThread
from commitline.infrastructure.kafka.publisher import Publisher
from commitline.infrastructure.kafka.producer import client_options
from commitline.infrastructure.kafka.reader import ConsumedRecord, read_topics
from commitline.infrastructure.metrics import MetricsServer

log = logging.getLogger(__name__)


def check_publishing(settings: Settings) -> None:
    """Raise ConfigurationError naming KAFKA_BOOTSTRAP_SERVERS when ``settings`` publish a real database's events
    to no real Kafka (``Commitline.publisher``); ``commitline publish`` asks before it opens the store."""
    if settings.kafka_bootstrap_servers is None and settings.database_url is not None:
        raise ConfigurationError(
            "KAFKA_BOOTSTRAP_SERVERS",
            "is not set, and COMMITLINE_DATABASE_URL names a real database: refusing to publish its events "
            "to a throwaway embedded broker (their position would be saved and a real Kafka would never "
            "get them). Set KAFKA_BOOTSTRAP_SERVERS to the Kafka cluster to publish to")


class Followers:
    """Building and running the publisher and any follower (a part of ``Commitline``)."""

    def start_embedded_kafka_if_unset(self) -> Settings:
        """Settings to publish with: the configured Kafka, or else a freshly started embedded Tansu broker.
        An explicit choice of a throwaway broker (the demo, tests, benchmarks); ``publisher()`` decides
        for itself when it may use one."""
        if self.settings.kafka_bootstrap_servers is not None:
            return self.settings
        if self.embedded_postgres is not None:  # the data folder's broker, shared like its PostgreSQL
            if self.shared_kafka is None:
                self.shared_kafka = shared_kafka(self.settings.data_dir)
                broker = self.shared_kafka.acquire()
                log.info("%s embedded Kafka-protocol broker (Tansu, records in memory only) at %s",
                         "started" if self.shared_kafka.started_here else "using the running",
                         broker.bootstrap_servers)
            bootstrap_servers = self.shared_kafka.instance.bootstrap_servers  # type: ignore[union-attr]
        else:
            if self.embedded_kafka is None:
                self.embedded_kafka = EmbeddedKafka()
                self.embedded_kafka.start()
                log.info("started a private embedded Kafka-protocol broker (Tansu, records in memory only) at %s",
                         self.embedded_kafka.bootstrap_servers)
            bootstrap_servers = self.embedded_kafka.bootstrap_servers
        # Tansu rejects InitProducerId, so the embedded broker runs without producer idempotence.
        return self.settings.model_copy(update={"kafka_bootstrap_servers": bootstrap_servers,
                                                "kafka_idempotence": False})

    def publisher(self, settings: Settings | None = None, **options: Any) -> Publisher:
        """The Kafka publisher, to ``settings``' broker or by default the configured Kafka: one instance of the
        publish group, owning its fair share of the ``COMMITLINE_PUBLISH_BUCKETS`` buckets. Without a
        configured Kafka it publishes to an embedded broker only when the database is embedded too (the
        demo setup, where both vanish together); with a configured database it raises ConfigurationError
        naming KAFKA_BOOTSTRAP_SERVERS, since positions saved for a broker that vanishes with the process
        would make a real Kafka configured later never receive those events."""
        if settings is None:
            check_publishing(self.settings)
            settings = self.start_embedded_kafka_if_unset()
            options.setdefault("broker_in_memory", self.settings.kafka_bootstrap_servers is None)
        client_options(settings)  # a TLS file that cannot be loaded is refused now, not once publishing starts
        options.setdefault("tracing", self.tracing)
        return Publisher(self.recorder, self.conninfo, settings, self.domain.registry, **options)

    @contextmanager
    def background(self, *followers: Any) -> Iterator[list[FollowerThread]]:
        """Run followers (or functions making them: ``app.projector``, ``app.publisher``) in threads of
        their own while the block runs; they stop at its end. For programs that are not asyncio."""
        threads = [FollowerThread(f if callable(f) and not hasattr(f, "run") else (lambda f=f: f))
                   for f in followers]
        started: list[FollowerThread] = []
        try:
            for thread in threads:
                started.append(thread.start())
            yield started
        finally:
            for thread in reversed(started):
                thread.stop()

    def published(self, expect_at_least: int, *, timeout: float = 60, quiet_for: float = 1.0,
                  settings: Settings | None = None) -> list[ConsumedRecord]:
        """Every record published to the domain's topics, read back from the broker (``settings``' broker, by
        default the configured one): forensics and demonstrations."""
        settings = settings or self.settings
        if settings.kafka_bootstrap_servers is None:
            raise ConfigurationError("KAFKA_BOOTSTRAP_SERVERS", "is not set: there is no broker to read from")
        return read_topics(settings.kafka_bootstrap_servers, settings.kafka_topic_prefix or "", expect_at_least,
                           timeout, quiet_for, aggregate_types=self.domain.registry.aggregate_types)

    def run_until_signalled(self, *followers: Follower, drain: bool = False) -> bool:
        """Run the followers until SIGINT or SIGTERM (or, with ``drain``, until each has caught up or stopped
        at a poison event: its ``waiting_for_operator`` says which), or until one of them raises: the others then
        stop as on SIGTERM, and the first error is raised once they have. Running them is the process's job now, so
        the garbage collector is set for batches of short-lived objects meanwhile (``bulk_collection``). False when
        a drain was interrupted (a signal) before every follower had caught up or stopped at a poison event."""
        behind = set(followers) if drain else set()

        async def run() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            self.liveness.attach(loop)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            if drain:

                def caught_up(follower: Follower) -> None:
                    behind.discard(follower)
                    if not behind:
                        stop.set()

                for follower in followers:  # one stopped at a poison event cannot catch up: it is done too
                    follower.on_caught_up = follower.on_poisoned = lambda f=follower: caught_up(f)

            async def guarded(follower: Follower) -> None:
                try:
                    await follower.run(stop)
                except BaseException:
                    stop.set()  # the others stop as on SIGTERM, handing their work back, before the error ends it
                    raise

            try:
                ended = await asyncio.gather(*(guarded(f) for f in followers), return_exceptions=True)
            finally:
                self.liveness.detach()
            for outcome in ended:
                if isinstance(outcome, BaseException):
                    raise outcome

        with bulk_collection():
            asyncio.run(run())
        return not behind

    @contextmanager
    def metrics_endpoint(self, host: str, port: int | None, followers: Sequence[Any]) -> Iterator[None]:
        """``/metrics`` and ``/healthz`` on ``host:port`` while the block runs ``followers`` (nothing without a
        port); ConfigurationError naming --metrics-port if it cannot listen there."""
        if port is None:
            yield
            return
        with MetricsServer(host, port, self.status, followers, self.liveness.problem):
            yield
