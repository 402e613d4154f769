"""The API key cache's rules, without a database: what it keeps, for how long, and what empties it. The feed is a
scripted stand-in for the listening connection (``tests/integration/test_api_key_cache.py`` uses the real one)."""

from __future__ import annotations

import threading

from commitline.infrastructure.store.api_key_cache import CHANGED, DEAF, QUIET, ApiKeyCache


class ScriptedFeed:
    """Answers each poll with the next of ``answers`` (then the last one for ever)."""

    def __init__(self, *answers: str):
        self.answers = list(answers)
        self.closed = False

    def poll(self, lock: threading.Lock) -> str:
        assert lock.locked(), "the feed is polled holding the cache's lock"
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reader(value: object | None) -> tuple[list[int], object]:
    calls: list[int] = []

    def read() -> object | None:
        calls.append(1)
        return value

    return calls, read


def test_an_active_key_is_read_once_while_nothing_changes() -> None:
    cache = ApiKeyCache(ScriptedFeed(CHANGED, QUIET), ttl_s=60)  # type: ignore[arg-type]
    calls, read = reader("key of acme")
    assert [cache.resolve("k1", read) for _ in range(5)] == ["key of acme"] * 5
    assert len(calls) == 1 and cache.reads == 1


def test_an_unknown_or_revoked_key_is_never_kept() -> None:
    cache = ApiKeyCache(ScriptedFeed(QUIET), ttl_s=60)  # type: ignore[arg-type]
    calls, read = reader(None)
    assert [cache.resolve("k1", read) for _ in range(3)] == [None] * 3
    assert len(calls) == 3  # a key made a moment later works at once


def test_a_key_is_kept_at_most_ttl_seconds() -> None:
    clock = Clock()
    cache = ApiKeyCache(ScriptedFeed(QUIET), ttl_s=60, clock=clock)  # type: ignore[arg-type]
    calls, read = reader("key")
    cache.resolve("k1", read)
    clock.now += 59.9
    cache.resolve("k1", read)
    assert len(calls) == 1
    clock.now += 0.2
    cache.resolve("k1", read)
    assert len(calls) == 2


def test_a_notified_change_empties_the_cache() -> None:
    cache = ApiKeyCache(ScriptedFeed(QUIET, QUIET, CHANGED, QUIET), ttl_s=60)  # type: ignore[arg-type]
    calls, read = reader("key")
    cache.resolve("k1", read)
    cache.resolve("k1", read)
    assert len(calls) == 1
    cache.resolve("k1", read)  # the change was notified: read again
    cache.resolve("k1", read)
    assert len(calls) == 2


def test_without_a_listening_connection_every_key_is_read_and_nothing_kept() -> None:
    feed = ScriptedFeed(QUIET, QUIET, DEAF, DEAF, QUIET, QUIET)
    cache = ApiKeyCache(feed, ttl_s=60)  # type: ignore[arg-type]
    calls, read = reader("key")
    cache.resolve("k1", read)
    cache.resolve("k1", read)
    assert len(calls) == 1
    cache.resolve("k1", read)  # deaf: what it held may be stale (changes while deaf are not heard)
    cache.resolve("k1", read)
    assert len(calls) == 3
    cache.resolve("k1", read)  # listening again: nothing kept from before, read once more, then kept
    cache.resolve("k1", read)
    assert len(calls) == 4


def test_a_read_racing_a_notified_change_is_not_kept() -> None:
    """A key read as active just before its revocation, the revocation's notification taken by another request
    while the read was under way: what the read found is answered but not kept."""
    feed = ScriptedFeed(QUIET)
    cache = ApiKeyCache(feed, ttl_s=60)  # type: ignore[arg-type]
    revoked = {"now": False}

    def read_then_revoked() -> object | None:
        found = None if revoked["now"] else "key"
        revoked["now"] = True
        feed.answers = [CHANGED, QUIET]  # the next poll (another request's, below) takes the notification
        cache.resolve("other key", lambda: "other")
        return found

    assert cache.resolve("k1", read_then_revoked) == "key"
    calls, read = reader(None)
    assert cache.resolve("k1", read) is None and len(calls) == 1  # read again, found revoked


def test_keys_are_kept_under_their_digest_never_as_text() -> None:
    cache = ApiKeyCache(ScriptedFeed(QUIET), ttl_s=60)  # type: ignore[arg-type]
    secret = "clk_0123456789ab_" + "s" * 43
    cache.resolve(secret, lambda: "key")
    assert secret not in repr(vars(cache)) and all(isinstance(k, bytes) and len(k) == 32 for k in cache._entries)


def test_forgetting_empties_the_cache_and_a_read_under_way_is_not_kept() -> None:
    cache = ApiKeyCache(ScriptedFeed(QUIET), ttl_s=60)  # type: ignore[arg-type]
    cache.resolve("k1", lambda: "key")

    def read_while_forgotten() -> object | None:
        cache.forget()
        return "key 2"

    assert cache.resolve("k2", read_while_forgotten) == "key 2"
    calls, read = reader("key")
    cache.resolve("k1", read)
    cache.resolve("k2", read)
    assert len(calls) == 2


def test_closing_empties_the_cache_and_closes_its_feed() -> None:
    feed = ScriptedFeed(QUIET)
    cache = ApiKeyCache(feed, ttl_s=60)  # type: ignore[arg-type]
    cache.resolve("k1", lambda: "key")
    cache.close()
    assert feed.closed and not cache._entries
