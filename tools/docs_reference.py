"""The documentation's reference, generated from the code when the site is built, so it cannot drift.

An MkDocs hook (``hooks:`` in ``mkdocs.yml``). A page asks for a generated part with a comment on a line of
its own, ``<!-- generated: NAME -->``, which is replaced (with what follows it up to ``<!-- end of generated:
NAME -->``, if that line comes) by:

- ``configuration``: every environment variable (the settings' definition, ``infrastructure/config.py``);
- ``errors``: every error code by HTTP status (``http/problems.py``), and every error class with its code;
- ``cli``: the help of every ``commitline`` command and subcommand (the argument parsers themselves);
- ``http-operations``: every route of the HTTP API with its statuses (the server's own ``/openapi.json``);
- ``metrics``: every Prometheus metric (``infrastructure/metrics.py``'s catalogue);
- ``envelope``: the Kafka record's value (``infrastructure/kafka/envelope.py``'s JSON Schema).

The parts that depend on commitline's code alone (``COMMITTED``) are also kept in the pages themselves, between
the two comments, so that a page read in the repository holds its table too: ``python -m tools.docs_reference``
writes them there, and the suite checks they are what the code gives. The others depend on the installed
versions of argparse and FastAPI, so the repository holds a pointer to where to read them instead (``POINTERS``).

It also adds ``reference/openapi.json`` and an interactive viewer of it (``reference/api/index.html``) whose
Swagger UI scripts come from an installed package, never a CDN. The built-in example domain is what is shown;
a team's own domain's server describes its own commands at ``/openapi.json`` and ``/docs``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import io
import os
import pkgutil
import re
from contextlib import redirect_stdout
from http import HTTPStatus
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
from mkdocs.structure.files import File, Files

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$(?:\n.*?^<!-- end of generated: \1 -->$)?",
                    re.MULTILINE | re.DOTALL)
SWAGGER_ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png")


def configuration() -> str:
    from commitline.infrastructure.config import variables_markdown

    return variables_markdown()


def _error_classes() -> list[type]:
    from commitline.domain.errors import CommitlineError

    import commitline

    for module in pkgutil.walk_packages(commitline.__path__, "commitline."):  # a class exists once imported
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    from commitline.framework.loading import load_domain

    load_domain(None)  # the built-in examples' own errors
    seen: list[type] = []
    stack = [CommitlineError]
    while stack:
        cls = stack.pop()
        seen.append(cls)
        stack.extend(cls.__subclasses__())
    # commitline's own and its examples' (not those of whatever other domain this process imported)
    return sorted({c for c in seen if not c.__name__.startswith("_") and c.__module__.startswith("commitline.")},
                  key=lambda c: (c.code, c.__name__))


def errors() -> str:
    from commitline.framework.loading import load_domain
    from commitline.http.problems import status_markdown

    rows = ["| `code` | class | where it comes from | meaning |", "|---|---|---|---|"]
    for cls in _error_classes():
        # the class's own docstring (inspect.getdoc would give a base class's), its first paragraph, as Markdown
        doc = " ".join((inspect.cleandoc(cls.__dict__.get("__doc__") or "")).split("\n\n")[0].split())
        doc = doc.replace("``", "`") or f"the message: `{cls.message}`"
        rows.append(f"| `{cls.code}` | `{cls.__name__}` | `{cls.__module__}` | {doc.replace('|', '/')} |")
    return (f"### By HTTP status\n\n{status_markdown(load_domain(None).error_statuses)}\n\n"
            f"### Every error class\n\n{chr(10).join(rows)}")


def _subcommands(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(prefix, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _subcommands(sub, f"{prefix} {name}")
    return found


def cli() -> str:
    from commitline.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width: the same page on every machine
    parts = []
    for name, parser in _subcommands(build_parser(), "commitline"):
        level = "###" if name.count(" ") <= 1 else "####"
        parts.append(f"{level} `{name}`\n\n```text\n{parser.format_help().rstrip()}\n```")
    return "\n\n".join(parts)


def openapi_document() -> dict[str, Any]:
    from commitline.framework.loading import load_domain
    from commitline.http.app import create_app

    return create_app(None, domain=load_domain(None)).openapi()


def http_operations() -> str:
    document = openapi_document()
    rows = ["| method | path | what it does | answers |", "|---|---|---|---|"]
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method not in {"get", "post", "put", "delete", "patch"}:
                continue
            answers = ", ".join(f"{code}" + (f" {HTTPStatus(int(code)).phrase}" if code.isdigit() else "")
                                for code in operation.get("responses", {}))
            summary = operation.get("summary") or operation.get("operationId", "")
            rows.append(f"| {method.upper()} | `{path}` | {summary} | {answers} |")
    return "\n".join(rows)


def metrics() -> str:
    from commitline.infrastructure.metrics import catalogue

    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for name, kind, labels, text in catalogue():
        shown = {"counter": f"{name}_total", "histogram": f"{name}_bucket`, `_sum`, `_count"}.get(kind, name)
        rows.append(f"| `{shown}` | {kind} | {', '.join(f'`{label}`' for label in labels)} | {text} |")
    return "\n".join(rows)


def envelope() -> str:
    from commitline.infrastructure.kafka.envelope import ENVELOPE_SCHEMA

    rows = ["| field | type | meaning |", "|---|---|---|"]
    for field, spec in ENVELOPE_SCHEMA["properties"].items():
        kind = spec["type"] + (f" ({spec['format']})" if "format" in spec else "")
        rows.append(f"| `{field}` | {kind} | {spec.get('description', '')} |")
    schema = orjson.dumps(ENVELOPE_SCHEMA, option=orjson.OPT_INDENT_2).decode()
    return f"{ENVELOPE_SCHEMA['description']}\n\n{chr(10).join(rows)}\n\nAs JSON Schema:\n\n```json\n{schema}\n```"


GENERATORS = {"configuration": configuration, "errors": errors, "cli": cli, "http-operations": http_operations,
              "metrics": metrics, "envelope": envelope}

#: The parts the repository's pages hold as generated (the site generates every part afresh anyway).
COMMITTED = ("configuration", "errors", "metrics", "envelope")

#: What the repository's pages hold instead of the other parts.
POINTERS = {
    "cli": "*In the repository this part is not written out: `commitline COMMAND --help` prints each command's "
           "help, and the built site (`make docs`) lists them all here.*",
    "http-operations": "*In the repository this part is not written out: a running server describes every route "
                       "at `/openapi.json` and `/docs`, and the built site (`make docs`) lists them here.*",
}

DOCS = Path(__file__).resolve().parents[1] / "docs"


def generate(name: str) -> str:
    with redirect_stdout(io.StringIO()):
        return GENERATORS[name]()


def kept(name: str) -> str:
    """What the repository's page holds between the comments of the part ``name``."""
    return generate(name) if name in COMMITTED else POINTERS[name]


def blocks(markdown: str) -> dict[str, str | None]:
    """Each part a page asks for, with what the page holds for it (None: the opening comment alone)."""
    found: dict[str, str | None] = {}
    for match in MARKER.finditer(markdown):
        text = match.group(0)
        body = text.partition("\n")[2].rpartition("\n")[0] if "\n" in text else None
        found[match.group(1)] = body.strip("\n") if body is not None else None
    return found


def refreshed(markdown: str) -> str:
    """``markdown`` with each part's block as ``kept`` gives it."""
    return MARKER.sub(lambda m: f"<!-- generated: {m.group(1)} -->\n\n{kept(m.group(1))}\n\n"
                                f"<!-- end of generated: {m.group(1)} -->", markdown)


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if MARKER.search(p.read_text()))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def generated(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_uri}: no generated part is called {name!r} ({', '.join(GENERATORS)})")
        return generate(name)

    return MARKER.sub(generated, markdown)


def on_files(files: Files, config: Any) -> Files:
    document = openapi_document()
    files.append(File.generated(config, "reference/openapi.json",
                                content=orjson.dumps(document, option=orjson.OPT_INDENT_2)))
    assets = resources.files("fastapi_offline") / "static"
    for name in SWAGGER_ASSETS:
        files.append(File.generated(config, f"reference/api/{name}", content=(assets / name).read_bytes()))
    files.append(File.generated(config, "reference/api/index.html", content=_viewer(document["info"]["title"])))
    return files


def _viewer(title: str) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}: HTTP API</title>
<link rel="icon" href="favicon.png"><link rel="stylesheet" href="swagger-ui.css"></head>
<body><div id="swagger-ui"></div><script src="swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({{url: "../openapi.json", dom_id: "#swagger-ui", supportedSubmitMethods: []}});</script>
</body></html>
"""


if __name__ == "__main__":  # writes the generated parts into the repository's pages
    for path in pages():
        text = path.read_text()
        if (new := refreshed(text)) != text:
            path.write_text(new)
            print(f"refreshed {path.relative_to(DOCS.parent)}")
