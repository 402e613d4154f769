"""Every commitline process logs one line per event, in one layout: a message with line breaks (a PostgreSQL
error's text) keeps them escaped, while a traceback stays as Python writes it."""

from __future__ import annotations

import logging

from commitline.composition.logs import FORMAT, OneLineFormatter


def record(message: str, *args: object, exc_info: object = None) -> logging.LogRecord:
    return logging.LogRecord("commitline.test", logging.ERROR, __file__, 1, message, args, exc_info)


def test_a_message_with_line_breaks_is_one_line_and_a_traceback_stays_whole() -> None:
    formatter = OneLineFormatter(FORMAT)
    line = formatter.format(record("PostgreSQL unavailable (%s); retrying", "server closed the connection\n"
                                   "\tThis probably means the server terminated abnormally\r\n"))
    assert "\n" not in line and "\r" not in line
    assert line.endswith(" ERROR commitline.test PostgreSQL unavailable (server closed the connection\\n\tThis "
                         "probably means the server terminated abnormally\\r\\n); retrying")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        text = formatter.format(record("failed", exc_info=sys.exc_info()))
    first, *rest = text.split("\n")
    assert first.endswith(" ERROR commitline.test failed") and rest[0] == "Traceback (most recent call last):"
