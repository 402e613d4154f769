"""The HTTP benchmark's native load generator (``bench/wrk.py`` with ``bench/http_post.lua``) against a real
``commitline serve``: every response it counts wrote one event under its own Idempotency-Key, and a run
where any response is not the status expected (a 200 where the item should have been created, a 401 for an
unknown key) fails loudly instead of printing a figure. ``make test`` and ``make bench`` install wrk
(``.ci/install-wrk``); without it the test fails saying so."""

from __future__ import annotations

import shutil
import uuid

import pytest

from bench.wrk import WrkFailed, run_wrk
from tests.integration.http.conftest import Server
from tests.support import count_rows



@pytest.fixture(autouse=True)
def wrk_installed() -> None:
    if shutil.which("wrk") is None:
        pytest.fail("wrk is not installed: run .ci/install-wrk (make test and make bench run it)")


def test_every_counted_response_is_one_event_and_any_other_status_fails_the_run(
        server: Server, pg_dsn: str, schema: str) -> None:
    url = f"{server.base_url}/v1/commands"
    env = {"BENCH_KEY": server.key("acme"), "BENCH_ITEMS": f"{uuid.uuid4()},{uuid.uuid4()}", "BENCH_RUN": "first",
           "BENCH_CREATE": "1"}

    report = run_wrk(url, connections=2, duration=1, env=env)
    assert report.requests == report.responses > 2 and report.unexpected == report.non_2xx == 0
    assert 0 < report.p50 <= report.p99 and report.rate > 0
    rows = count_rows(pg_dsn, schema)
    assert rows["events"] == rows["idempotency_keys"]  # one fresh key per request
    # wrk stops with up to one request per connection still in flight, which the server completes uncounted
    assert report.responses <= rows["events"] <= report.responses + 2

    with pytest.raises(WrkFailed, match=r"responses not the status expected, first: 200 \(expected 201\)"):
        run_wrk(url, connections=2, duration=1, env={**env, "BENCH_RUN": "again"})  # the items exist by now

    unknown = "clk_000000000000_" + "A" * 43
    with pytest.raises(WrkFailed, match="non-2xx/3xx responses") as refused:
        run_wrk(url, connections=2, duration=1, env={**env, "BENCH_KEY": unknown, "BENCH_CREATE": "0"})
    assert "401" in str(refused.value)
