"""Driving an HTTP server with ``wrk`` (a native load generator, Debian's ``wrk`` package) and reading its
report (measures nothing itself; ``bench/http_api.py`` names the baseline).

- :func:`wrk_binary`: where ``wrk`` is (``make bench`` installs it when missing, ``.ci/install-wrk``);
- :func:`run_wrk`: one run of ``wrk --latency`` with a Lua script, its report parsed into a :class:`WrkReport`;
- :func:`parse_report`: requests/s, p50/p99 from the latency distribution, non-2xx/3xx responses, socket
  errors, and the line ``bench/http_post.lua`` prints: responses that were not the status expected.

A run with any socket error, any non-2xx/3xx response or any unexpected status raises ``WrkFailed``: a
figure is only printed for requests that all did what they were meant to.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

LUA_SCRIPT = Path(__file__).with_name("http_post.lua")
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = r"([0-9.]+)(us|ms|s|m|h)"


class WrkFailed(RuntimeError):
    """wrk could not run, or some request did not answer as expected."""


@dataclass(frozen=True)
class WrkReport:
    rate: float  # requests/s over the run (wrk's Requests/sec)
    requests: int
    p50: float  # seconds
    p99: float
    non_2xx: int  # wrk's "Non-2xx or 3xx responses"
    socket_errors: dict[str, int]  # connect, read, write, timeout
    responses: int  # counted by the script's response()
    unexpected: int  # responses whose status was not the one expected
    first_unexpected: str

    def percentile(self, q: float) -> float:
        return {0.5: self.p50, 0.99: self.p99}[q]


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if found is None:
        raise WrkFailed("wrk is not installed: `make bench` installs it (.ci/install-wrk: apt-get install wrk, as root "
                        "or with password-less sudo)")
    return found


def _seconds(value: str, unit: str) -> float:
    return float(value) * _UNITS[unit]


def parse_report(output: str) -> WrkReport:
    """The figures of ``wrk --latency -s bench/http_post.lua`` output; WrkFailed if a part is missing."""
    def need(pattern: str) -> re.Match[str]:
        match = re.search(pattern, output, re.MULTILINE)
        if match is None:
            raise WrkFailed(f"wrk's report has no {pattern!r}:\n{output[-2000:]}")
        return match

    p50, p99 = need(rf"^\s*50%\s+{_DURATION}\s*$"), need(rf"^\s*99%\s+{_DURATION}\s*$")
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", output)
    sockets = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    script = need(r"^commitline-wrk: responses=(\d+) unexpected=(\d+) first=(.*)$")
    return WrkReport(
        rate=float(need(r"^Requests/sec:\s*([0-9.]+)").group(1)),
        requests=int(need(r"^\s*(\d+) requests in ").group(1)),
        p50=_seconds(*p50.groups()), p99=_seconds(*p99.groups()),
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
        socket_errors=dict(zip(("connect", "read", "write", "timeout"),
                               (int(n) for n in sockets.groups()) if sockets else (0, 0, 0, 0), strict=True)),
        responses=int(script.group(1)), unexpected=int(script.group(2)), first_unexpected=script.group(3).strip())


def run_wrk(url: str, *, connections: int, duration: int, env: dict[str, str], timeout_s: float = 30) -> WrkReport:
    """``wrk -t N -c N --latency`` (one thread per connection, as ``http_post.lua`` expects) for ``duration``
    seconds (wrk takes whole seconds); WrkFailed unless every response was the one expected."""
    if not isinstance(duration, int) or duration < 1:
        raise ValueError(f"wrk runs for whole seconds, at least 1: not {duration!r}")
    command = [wrk_binary(), "-t", str(connections), "-c", str(connections), "-d", f"{duration}s",
               "--timeout", f"{timeout_s:g}s", "--latency", "-s", str(LUA_SCRIPT), url]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env},
                          timeout=duration + timeout_s + 60)
    if done.returncode != 0:
        raise WrkFailed(f"wrk exited with {done.returncode}: {done.stderr.strip()[-2000:]}\n{done.stdout[-2000:]}")
    return checked(parse_report(done.stdout))


def checked(report: WrkReport) -> WrkReport:
    """``report`` if every request answered as expected; WrkFailed naming what did not otherwise."""
    failures = []
    if report.non_2xx:
        failures.append(f"{report.non_2xx} non-2xx/3xx responses")
    if any(report.socket_errors.values()):
        failures.append("socket errors " + ", ".join(f"{k} {v}" for k, v in report.socket_errors.items()))
    if report.unexpected:
        failures.append(f"{report.unexpected} of {report.responses} responses not the status expected, first: "
                        f"{report.first_unexpected}")
    if failures:
        raise WrkFailed("wrk: " + "; ".join(failures))
    return report
