"""The /docs page, rendered on the server from the application's own OpenAPI document: no scripts, no
stylesheets from a CDN, so it works offline and behind firewalls (the machine-readable document is /openapi.json)."""

from __future__ import annotations

import json
from html import escape
from typing import Any

STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
h2{margin-top:2rem;border-bottom:1px solid #ccc}.method{font-weight:bold;font-family:monospace;padding:0 .4em;
border-radius:3px;color:#fff;background:#1e7e4e}.method.get{background:#26a}code,pre{background:#f4f4f4}
pre{padding:.6em;overflow-x:auto;font-size:.85em}details{margin:.3em 0}"""


def _schema(document: dict[str, Any], schema: dict[str, Any]) -> str:
    """A schema as JSON, with $refs to components resolved one level so the page is readable on its own."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = {"title": name, **document.get("components", {}).get("schemas", {}).get(name, {})}
    return escape(json.dumps(schema, indent=2))


def render_docs(document: dict[str, Any]) -> str:
    info = document.get("info", {})
    # lang and <main>: a screen reader picks its voice from the one and jumps to the content by the other.
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{escape(info.get('title', 'API'))} "
             f"docs</title><style>{STYLE}</style></head><body><main><h1>{escape(info.get('title', 'API'))}</h1>",
             f"<p>{escape(info.get('summary', '') or info.get('description', ''))}</p>",
             "<p>Machine-readable: <a href='/openapi.json'>/openapi.json</a>. Errors are always "
             "<code>{\"error\": \"...\"}</code>.</p>"]
    for path, methods in document.get("paths", {}).items():
        for method, operation in methods.items():
            parts.append(f"<h2><span class='method {escape(method)}'>{escape(method.upper())}</span> "
                         f"<code>{escape(path)}</code></h2>")
            parts.append(f"<p>{escape(operation.get('description') or operation.get('summary', ''))}</p>")
            for parameter in operation.get("parameters", []):
                parts.append(f"<p>parameter <code>{escape(parameter['name'])}</code> ({escape(parameter['in'])}"
                             f"{', required' if parameter.get('required') else ''})</p>")
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                parts.append(f"<details><summary>request body</summary><pre>{_schema(document, body['schema'])}"
                             f"</pre></details>")
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                schema = next(iter(content.values()), {}).get("schema") if content else None
                detail = f"<pre>{_schema(document, schema)}</pre>" if schema else ""
                parts.append(f"<details><summary>{escape(status)}: {escape(response.get('description', ''))}"
                             f"</summary>{detail}</details>")
    parts.append("</main></body></html>")
    return "\n".join(parts)
