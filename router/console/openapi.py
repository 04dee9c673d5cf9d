"""The OpenAPI description of the gateway's own endpoints, served at GET /openapi.json.

It describes what the gateway itself checks; fields it does not need pass through to the
engine and are allowed (`additionalProperties`). The route names of the running config
are the `model` values.
"""

from __future__ import annotations

from typing import Any

from policies.apis import Api
from policies.config import Config, Public

_ERROR = {"$ref": "#/components/schemas/Error"}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): {"description": "an OpenAI-shaped error",
                     "content": {"application/json": {"schema": _ERROR}}} for s in statuses}


def _completion(kind: str, models: list[str]) -> dict[str, Any]:
    required = ["model", "messages"] if kind == "chat" else ["model", "prompt"]
    text: dict[str, Any] = {"type": "string", "maxLength": 2000}
    properties: dict[str, Any] = {
        "model": {"type": "string", "enum": models},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object",
                           "properties": {"include_usage": {"type": "boolean"}}},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 64},
        "user": {"type": "string", "maxLength": 64},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    }
    if kind == "chat":
        properties["messages"] = {"type": "array", "minItems": 1, "maxItems": 8, "items": {
            "type": "object", "required": ["role", "content"],
            "properties": {"role": {"type": "string", "enum": ["system", "user", "assistant"]},
                           "content": text}}}
    else:
        properties["prompt"] = text
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": required, "properties": properties,
            "additionalProperties": True}}}},
        "responses": {"200": {"description": "the engine's answer (JSON, or SSE when "
                              "stream is true)"},
                      **_errors(400, 404, 408, 413, 415, 429, 502, 503, 504)},
    }


_ANTHROPIC_ERROR = {"$ref": "#/components/schemas/AnthropicError"}


def _messages(models: list[str], count: bool) -> dict[str, Any]:
    """Anthropic's Messages API (docs/messages-api.md): what the gateway checks of it."""
    text: dict[str, Any] = {"type": "string", "maxLength": 2000}
    properties: dict[str, Any] = {
        "model": {"type": "string", "enum": models},
        "messages": {"type": "array", "minItems": 1, "maxItems": 8, "items": {
            "type": "object", "required": ["role", "content"],
            "properties": {"role": {"type": "string", "enum": ["user", "assistant"]},
                           "content": text}}},
        "system": text,
    }
    required = ["model", "messages"]
    if not count:
        required.append("max_tokens")
        properties.update({
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": 64},
            "stream": {"type": "boolean"},
            "temperature": {"type": "number", "minimum": 0, "maximum": 1},
            "stop_sequences": {"type": "array", "maxItems": 4, "items": text},
            "metadata": {"type": "object", "properties": {"user_id": text}},
        })
    statuses = (400, 404, 408, 413, 415) if count else (
        400, 404, 408, 413, 415, 429, 502, 503, 504)
    return {
        "parameters": [{"name": "anthropic-version", "in": "header", "required": False,
                        "schema": {"type": "string", "maxLength": 40}}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": required, "properties": properties,
            "additionalProperties": True}}}},
        "responses": {"200": {"description": "{\"input_tokens\": N}, the gateway's "
                              "estimate" if count else "an Anthropic message (JSON, or "
                              "Anthropic's event stream when stream is true)"},
                      **{str(s): {"description": "an Anthropic-shaped error", "content": {
                          "application/json": {"schema": _ANTHROPIC_ERROR}}}
                         for s in statuses}},
    }


def _responses(models: list[str]) -> dict[str, Any]:
    """OpenAI's Responses API (docs/responses-api.md): passed through to an engine that
    serves it, else translated to chat completions (what needs server state: 400)."""
    text: dict[str, Any] = {"type": "string", "maxLength": 2000}
    message = {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant"]},
        "content": text}}
    properties: dict[str, Any] = {
        "model": {"type": "string", "enum": models},
        "input": {"oneOf": [text, {"type": "array", "minItems": 1, "maxItems": 8,
                                   "items": message}]},
        "instructions": text,
        "stream": {"type": "boolean"},
        "store": {"type": "boolean", "enum": [False]},
        "max_output_tokens": {"type": "integer", "minimum": 1, "maximum": 64},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "user": {"type": "string", "maxLength": 64},
        "metadata": {"type": "object", "additionalProperties": {"type": "string",
                                                                "maxLength": 64}},
    }
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["model", "input"], "properties": properties,
            "additionalProperties": True}}}},
        "responses": {"200": {"description": "a response object (JSON, or the response.* "
                              "event stream when stream is true)"},
                      **_errors(400, 404, 408, 413, 415, 429, 502, 503, 504)},
    }


def _embeddings(models: list[str]) -> dict[str, Any]:
    """One text, texts, token ids or lists of them; no `stream` (400)."""
    text: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 2000}
    tokens: dict[str, Any] = {"type": "array", "minItems": 1, "maxItems": 64,
                              "items": {"type": "integer", "minimum": 0, "maximum": 100_000}}
    properties: dict[str, Any] = {
        "model": {"type": "string", "enum": models},
        "input": {"oneOf": [text, {"type": "array", "minItems": 1, "maxItems": 16,
                                   "items": text},
                            tokens, {"type": "array", "minItems": 1, "maxItems": 8,
                                     "items": tokens}]},
        "encoding_format": {"type": "string", "enum": ["float", "base64"]},
        "dimensions": {"type": "integer", "minimum": 1, "maximum": 4096},
        "user": {"type": "string", "maxLength": 64},
    }
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["model", "input"], "properties": properties,
            "additionalProperties": True}}}},
        "responses": {"200": {"description": "the engine's embeddings (JSON)"},
                      **_errors(400, 404, 408, 413, 415, 429, 502, 503, 504)},
    }


def _get(description: str, *errors: int) -> dict[str, Any]:
    return {"get": {"responses": {"200": {"description": description}, **_errors(*errors)}}}


def openapi(config: Config) -> dict[str, Any]:
    models = sorted(config.routes)
    embedders = sorted(name for name, route in config.routes.items()
                       if Api.EMBEDDINGS in config.backends[route.primary].served_apis)
    when = {"type": "string", "maxLength": 40}
    report = _get("the cost report (slotgate report --json)", 400, 404)
    report["get"]["parameters"] = [
        {"name": name, "in": "query", "required": False, "schema": when}
        for name in ("since", "until", "experiment", "route", "baseline")]
    spec: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {"title": "slotgate", "version": "0.1.0",
                 "description": "OpenAI-compatible gateway with slot pools and queues"},
        "paths": {
            "/v1/chat/completions": {"post": _completion("chat", models)},
            "/v1/completions": {"post": _completion("completions", models)},
            "/v1/messages": {"post": _messages(models, count=False)},
            "/v1/messages/count_tokens": {"post": _messages(models, count=True)},
            "/v1/responses": {"post": _responses(models)},
            "/v1/embeddings": {"post": _embeddings(embedders or models)},
            "/v1/models": _get("the public model names"),
            "/healthz": _get("alive"),
            "/readyz": _get("ready to serve", 503),
            "/metrics": _get("Prometheus exposition"),
            "/admin/report": report,
        },
        "components": {"schemas": {"AnthropicError": {
            "type": "object", "required": ["type", "error"],
            "properties": {"type": {"type": "string", "enum": ["error"]}, "error": {
                "type": "object", "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}},
            "Error": {
            "type": "object", "required": ["error"],
            "properties": {"error": {
                "type": "object", "required": ["message", "type", "code"],
                "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                               "code": {"type": "string", "nullable": True},
                               "param": {"type": "string", "nullable": True}}}}}}},
    }
    if config.auth.enabled:
        _secured(spec, config.auth.public)
    return spec


_PUBLIC_PATHS = {Public.METRICS: "/metrics", Public.MODELS: "/v1/models",
                 Public.OPENAPI: "/openapi.json", Public.PAGES: "/dashboard/events"}


def _secured(spec: dict[str, Any], public: frozenset[Public]) -> None:
    """Auth on: a bearer key everywhere (401), but on the probes and what is public."""
    spec["components"]["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer"},
        "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"}}
    spec["security"] = [{"bearer": []}]
    open_paths = {"/healthz", "/readyz", *(_PUBLIC_PATHS[what] for what in public
                                            if what in _PUBLIC_PATHS)}  # (tenants: no path)
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            if path in open_paths:
                operation["security"] = []
            elif path.startswith("/v1/messages"):  # Anthropic clients send x-api-key
                operation["security"] = [{"bearer": []}, {"x-api-key": []}]
                operation["responses"]["401"] = {
                    "description": "an Anthropic-shaped error",
                    "content": {"application/json": {"schema": _ANTHROPIC_ERROR}}}
            else:
                operation["responses"].update(_errors(401))
