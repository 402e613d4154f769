"""How every commitline process logs: one line per event on stderr, ``time LEVEL logger message``, at the level
``COMMITLINE_LOG_LEVEL`` (or ``--log-level``) chose. The CLI configures it as a command starts, and each worker
process of ``serve --workers N`` as it starts too (a spawned process inherits no logging configuration).

A message holding a line break (a PostgreSQL error's text has them) is written with ``\\n`` in its place, so
that one event stays one line for whatever collects the log; a traceback stays as Python writes it.
"""

from __future__ import annotations

import logging
import os

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
#: uvicorn's access line in the same layout (its formatter fills in these fields)
ACCESS_FORMAT = '%(asctime)s %(levelname)s %(name)s %(client_addr)s - "%(request_line)s" %(status_code)s'


class OneLineFormatter(logging.Formatter):
    """``FORMAT``, with line breaks in the message itself escaped."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        text = super().formatMessage(record)
        return text.replace("\r", "\\r").replace("\n", "\\n") if "\n" in text or "\r" in text else text


def chosen_level(default: str) -> str:
    """The level ``COMMITLINE_LOG_LEVEL`` names, else ``default``."""
    chosen = (os.environ.get("COMMITLINE_LOG_LEVEL") or "").upper()
    return chosen if chosen in LOG_LEVELS else default


def configure(level: str) -> None:
    """Log at ``level`` on stderr, one line per event (the root logger's handler)."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    if level != "DEBUG":  # httpx logs every request (a gateway's, an OTLP export) at INFO: not news
        logging.getLogger("httpx").setLevel(logging.WARNING)
