"""The operators' views on a port of their own (``commitline serve --operator-port``).

The status page (``/`` and its assets), ``/v1/status`` and ``/metrics`` need no API key and show every tenant's
followers and stuck saga instances with their reasons. By default ``serve`` answers them on the API's port, for a
machine where only operators reach it. With an operators' port the API's port answers them 404, and this
listener serves them (and ``/healthz``, ``/readyz``) beside it, so a deployment publishes the API port to
tenants and keeps the other on the operators' network.

``create_operator_app`` is that small application, over the serving process's ``Commitline``; ``OperatorListener``
runs it on uvicorn in a thread of the serving process (the supervisor's, with ``--workers N``: its ``/metrics``
sums every worker's files). The thread's server installs no signal handlers: the API's server owns the signals,
and ``serve`` stops this one after it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from fastapi import FastAPI

from commitline.composition import Commitline
from commitline.http import operations, status_page

log = logging.getLogger(__name__)
STARTING_TIMEOUT_S = 30


def create_operator_app(commitline: Commitline) -> FastAPI:
    """The status page, ``/v1/status``, ``/metrics``, ``/healthz`` and ``/readyz`` of ``commitline``."""
    from commitline.http.app import HeadAsGet, install_problem_handlers

    app = FastAPI(title="commitline operators", version="1", docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False, telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.commitline = commitline
    app.state.domain = commitline.domain
    install_problem_handlers(app)
    for router in (operations.router, operations.metrics_router, status_page.router):
        app.include_router(router)
    app.add_middleware(HeadAsGet)
    return app


class OperatorListener:
    """``create_operator_app(commitline)`` served at ``host:port`` by a thread, from ``start`` until ``stop``."""

    def __init__(self, commitline: Commitline, host: str, port: int, *, access_log: bool = True):
        import uvicorn

        config = uvicorn.Config(create_operator_app(commitline), host=host, port=port, access_log=access_log,
                                log_level="info", log_config=None, lifespan="off")  # serve's server configures
        self.server = uvicorn.Server(config)
        self.address = f"{host}:{port}"
        self._thread = threading.Thread(target=self._serve, name="commitline-operators-http", daemon=True)
        self._failed: BaseException | None = None

    def _serve(self) -> None:
        try:
            self.server.run()
        except BaseException as e:  # uvicorn exits (SystemExit) when it cannot bind: told to ``start``'s caller
            self._failed = e

    def start(self) -> None:
        """Listen, or raise OSError saying why not."""
        self._thread.start()
        deadline = time.monotonic() + STARTING_TIMEOUT_S
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise OSError(f"the operators' port {self.address} did not start listening"
                              + (f" ({self._failed!r})" if self._failed is not None else ""))
            time.sleep(0.02)
        log.info("the operators' views at http://%s/ (the status page, /v1/status, /metrics); the API's port "
                 "answers them 404", self.address)

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=STARTING_TIMEOUT_S)

    def __enter__(self) -> OperatorListener:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
