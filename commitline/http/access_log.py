"""The HTTP access log without API keys: uvicorn's logging configuration with a filter on its access lines.

A key belongs in the ``Authorization`` header, which is never logged; a client that puts one in a URL (a path
or a query string) would otherwise have it written to the log with the request line. Anything shaped like a
key (``clk_`` and what follows) is shown as ``clk_<redacted>``. The filter is named in the configuration by
its import path, so each worker process of ``serve --workers N`` builds its own.
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

_KEY_LIKE = re.compile(r"clk_[A-Za-z0-9_%-]+")
REDACTED = "clk_<redacted>"


def without_keys(text: str) -> str:
    """``text`` with anything shaped like an API key shown as ``clk_<redacted>``."""
    return _KEY_LIKE.sub(REDACTED, text) if "clk_" in text else text


class RedactApiKeys(logging.Filter):
    """Replaces every key-shaped text in an access line's arguments (the request line among them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(without_keys(a) if isinstance(a, str) else a for a in record.args)
        return True


def log_config() -> dict[str, Any]:
    """uvicorn's default logging configuration in commitline's layout (``composition/logs.py``: time, level,
    logger, one line each), its access lines passed through ``RedactApiKeys``."""
    from uvicorn.config import LOGGING_CONFIG

    from commitline.composition import logs

    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["default"].update({"fmt": logs.FORMAT, "use_colors": False})
    config["formatters"]["access"].update({"fmt": logs.ACCESS_FORMAT, "use_colors": False})
    config.setdefault("filters", {})["redact_api_keys"] = {"()": f"{__name__}.RedactApiKeys"}
    config["handlers"]["access"]["filters"] = ["redact_api_keys"]
    return config
