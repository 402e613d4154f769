"""``/openapi.json``: the API's description, as strict as the server and complete, so that a client
generated from it is right the first time (checked by fuzzing a real ``serve`` from it: schemathesis).

FastAPI describes the routes; this module completes that with what only commitline knows:

- the domain's commands as the body of ``POST /v1/commands`` (one of them, told apart by ``type``, which is
  required), the result they answer with, its ``Location`` and ``Idempotent-Replayed`` headers, and the
  ``Idempotency-Key`` header with the limits the server applies;
- the bearer API key every route but the operators' probes needs (``security``), and for every operation
  each status the server answers with: 401 (with ``WWW-Authenticate``), 400 for unusable parameters, 404
  where a path names something, 503 (with ``Retry-After``) where the store is read, each a problem
  document, and ``default``: any other error is one too;
- each error status of ``POST /v1/commands`` listing the error codes that answer with it (commitline's and
  the domain's own); the longest subject ``POST /v1/erasures`` takes and ``GET /v1/erasures`` looks up (the command
  boundary's string limit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from commitline.application.boundary import INT_MAX, INT_MIN, MAX_KEY_LENGTH, CommandLimits
from commitline.application.amounts import DECIMAL_TEXT, decimal_properties
from commitline.application.commands import Command
from commitline.application.results import DispatchResult
from commitline.composition import Domain
from commitline.http.commands import REPLAYED_HEADERS
from commitline.http.problems import PROBLEM_JSON, statuses

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/v1/status"})  # answer without an API key
NO_STORE_PATHS = frozenset({"/healthz", "/metrics"})  # never answer 503 (/metrics reports the store as a metric)
SECURITY = "apiKey"
REF = "#/components/schemas/{model}"
#: The Idempotency-Key the server accepts, as sent without surrounding white space: 1-255 printable ASCII.
KEY_PATTERN = rf"^[!-~]([ -~]{{0,{MAX_KEY_LENGTH - 2}}}[!-~])?$"
#: Text PostgreSQL can store: no NUL (the command boundary refuses it in every string; and a lone surrogate,
#: which no UTF-8 JSON text can carry anyway).
STORABLE_TEXT = r"^[^\x00]*$"

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem document; `code` and `details` are the typed error's, as the CLI prints them",
    "properties": {
        "type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
        "detail": {"type": "string"}, "instance": {"type": "string"}, "code": {"type": "string"},
        "error": {"type": "string"}, "details": {"type": "object"},
    },
    "required": ["type", "title", "status", "detail", "code", "details"],
}

_TEXT = {"type": "string"}
HEADERS: dict[str, dict[str, Any]] = {
    "WWW-Authenticate": {"description": 'the scheme to authenticate with: `Bearer realm="commitline"`',
                         "required": True, "schema": _TEXT},
    "Retry-After": {"description": "seconds to wait before retrying (with the same Idempotency-Key)",
                    "required": True, "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    "Location": {"description": "the created aggregate: `/v1/aggregates/{id}`", "required": True, "schema": _TEXT},
    "Idempotent-Replayed": {"description": "`true` when the key was used before: this is the first response again",
                            "schema": {"type": "string", "enum": ["true"]}},
    "X-Idempotent-Replayed": {"description": "the same as `Idempotent-Replayed`, under the name some clients "
                              "look for", "schema": {"type": "string", "enum": ["true"]}},
}


def problem(description: str, *headers: str) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description,
                                "content": {PROBLEM_JSON: {"schema": {"$ref": REF.format(model="Problem")}}}}
    if headers:
        response["headers"] = {name: HEADERS[name] for name in headers}
    return response


def describe(app: FastAPI, domain: Domain, limits: CommandLimits) -> dict[str, Any]:
    """The description of ``app`` serving ``domain``, its command bodies bounded by ``limits`` as the server
    bounds them."""
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    public = list(domain.catalog.public.values())
    _, commands = models_json_schema([(cls, "validation") for cls in public], ref_template=REF)
    for definition in commands.get("$defs", {}).values():
        _bounded(definition, limits)
    schemas.update(commands.get("$defs", {}))
    for cls in public:
        _strict_command(schemas[cls.__name__], cls)
    _decimals_as_text(schemas, public)
    _, results = models_json_schema([(DispatchResult, "serialization")], ref_template=REF)
    schemas.update(results.get("$defs", {}))
    result = schemas.pop(DispatchResult.__name__)
    result["properties"].pop("replayed", None)  # told by the Idempotent-Replayed header, not the body
    result["required"] = sorted(result["properties"])
    result["title"] = "CommandResult"
    schemas["CommandResult"] = result
    schemas["Problem"] = PROBLEM_SCHEMA
    components["securitySchemes"] = {SECURITY: {
        "type": "http", "scheme": "bearer",
        "description": "a tenant's API key (`commitline tenants add TENANT` prints it once)"}}
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            _complete(path, operation)
    _commands(schema["paths"]["/v1/commands"]["post"], public, domain.error_statuses)
    erasure = schema["paths"]["/v1/erasures"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    erasure["properties"]["subject"]["maxLength"] = limits.max_string_length  # as the server bounds it
    lookup = next(p for p in schema["paths"]["/v1/erasures"]["get"]["parameters"] if p["name"] == "subject")
    lookup["schema"]["anyOf"][0]["maxLength"] = limits.max_string_length  # any subject POST takes can be looked up
    return schema


def _bounded(node: Any, limits: CommandLimits) -> None:
    """What the command boundary checks in every value (``application/boundary.py``), written into each part
    of a command's schema: strings storable and at most ``max_string_length`` long, lists at most
    ``max_list_length`` long, integers in the signed 64-bit range."""
    if isinstance(node, list):
        for item in node:
            _bounded(item, limits)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if kind == "string" and "enum" not in node and "const" not in node:
        node["maxLength"] = min(node.get("maxLength", limits.max_string_length), limits.max_string_length)
        if "pattern" in node and node["pattern"] != STORABLE_TEXT:
            node.setdefault("allOf", []).append({"pattern": node["pattern"]})  # one pattern per schema: both apply
        node["pattern"] = STORABLE_TEXT
    elif kind == "array":
        node["maxItems"] = min(node.get("maxItems", limits.max_list_length), limits.max_list_length)
    elif kind == "integer":
        node["minimum"] = max(node.get("minimum", INT_MIN), INT_MIN)
        node["maximum"] = min(node.get("maximum", INT_MAX), INT_MAX)
    for key, value in node.items():
        if key not in ("enum", "const", "default", "examples"):
            _bounded(value, limits)


def _strict_command(schema: dict[str, Any], cls: type[Command]) -> None:
    """``type`` is required (the server needs it to know which command this is) and has one value."""
    name = cls.model_fields["type"].default
    schema["properties"]["type"] = {"type": "string", "enum": [name], "description": "this command's type"}
    schema["required"] = ["type", *(r for r in schema.get("required", []) if r != "type")]


def _decimals_as_text(schemas: dict[str, Any], public: Sequence[type[Command]]) -> None:
    """A ``Decimal`` field, in a command or in a model it holds, takes an integer or a string, never a number with
    a fraction (``parse_command`` refuses it). ``schemas``: the components, each model under its class name as
    pydantic names it (a model whose name two classes share is qualified there, and its schema is not found)."""
    for model, properties in decimal_properties(public).items():
        schema = schemas.get(model.__name__)
        if schema is None or schema.get("title") != model.__name__:
            continue
        for key in properties:
            _no_fractions(schema["properties"][key])


def _no_fractions(node: Any) -> None:
    """In a decimal field's schema, each ``number`` (pydantic's, for a binary float it would take) an ``integer``,
    and the ``string`` beside it (pydantic's ``Decimal``: a number or a string) one written as ``DECIMAL_TEXT``."""
    if isinstance(node, dict):
        members = node.get("anyOf")
        if isinstance(members, list) and {"type": "number"} in members:
            for member in members:
                if member == {"type": "string"}:
                    member["pattern"] = DECIMAL_TEXT
        if node.get("type") == "number":
            node["type"] = "integer"
        for value in node.values():
            _no_fractions(value)
    elif isinstance(node, list):
        for item in node:
            _no_fractions(item)


def _complete(path: str, operation: dict[str, Any]) -> None:
    responses = operation.setdefault("responses", {})
    if path not in OPEN_PATHS:
        operation["security"] = [{SECURITY: []}]
        responses["401"] = problem("missing, unknown or revoked API key (code: unauthorized)", "WWW-Authenticate")
    if any(p.get("in") in ("query", "path") for p in operation.get("parameters", [])):
        responses.setdefault("400", problem("a parameter the server cannot use (code: invalid_query)"))
    if "{" in path:
        responses.setdefault("404", problem("nothing of that id for this tenant"))
    if path not in NO_STORE_PATHS:
        existing = responses.get("503", {}).get("description")
        responses["503"] = problem(existing or "the store is unavailable: retry later (code: store_unavailable)",
                                   "Retry-After")
    responses["default"] = problem("any other error: a problem document")


def _commands(operation: dict[str, Any], public: Sequence[type[Command]], domain_statuses: Mapping[str, int]) -> None:
    operation["parameters"] = [{
        "name": "Idempotency-Key", "in": "header", "required": True,
        "description": "1-255 printable ASCII characters, one key per command; a retry sends the same key "
                       "(white space around it is not part of it)",
        "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH, "pattern": KEY_PATTERN}}]
    body = operation["requestBody"]["content"]["application/json"]
    body["schema"] = {
        "oneOf": [{"$ref": REF.format(model=cls.__name__)} for cls in public],
        "discriminator": {"propertyName": "type", "mapping": {
            cls.model_fields["type"].default: REF.format(model=cls.__name__) for cls in public}}}
    answer = {"application/json": {"schema": {"$ref": REF.format(model="CommandResult")}}}
    responses = operation["responses"]
    responses["200"].update(content=answer, headers={name: HEADERS[name] for name in REPLAYED_HEADERS})
    responses["201"].update(content=answer, headers={name: HEADERS[name]
                                                     for name in ("Location", *REPLAYED_HEADERS)})
    by_status: dict[str, list[str]] = {}
    for code, status in statuses(domain_statuses).items():
        by_status.setdefault(str(status), []).append(code)
    for status, response in responses.items():
        codes = by_status.get(status)
        if codes and status not in ("200", "201"):
            response["description"] += f" (codes: {', '.join(codes)})"
