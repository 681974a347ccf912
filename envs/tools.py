"""Tool schemas in the OpenAI/HF `tools` format and argument validation.

Real chat templates (Qwen3's) render these schemas verbatim, one JSON object per line.
Validation covers the JSON-schema subset tool parameters use: an object with typed
properties, `required`, and no additional properties.
"""

from __future__ import annotations

from typing import Any

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def function_tool(name: str, description: str, properties: dict[str, Any] | None = None,
                  required: list[str] | None = None) -> dict[str, Any]:
    """A tool schema with object parameters; no additional properties are allowed."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties or {},
                "required": required or [],
                "additionalProperties": False,
            },
        },
    }


def tools_by_name(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Map tool name -> its parameters schema."""
    return {t["function"]["name"]: t["function"]["parameters"] for t in tools}


def argument_error(parameters: dict[str, Any], arguments: Any) -> str | None:
    """Why `arguments` does not satisfy the parameters schema, or None when it does."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    properties: dict[str, Any] = parameters.get("properties", {})
    unknown = sorted(set(arguments) - set(properties))
    if unknown:
        return f"unexpected argument(s) {unknown}; allowed: {sorted(properties)}"
    missing = [k for k in parameters.get("required", []) if k not in arguments]
    if missing:
        return f"missing required argument(s) {missing}"
    for key, value in arguments.items():
        expected = properties[key].get("type")
        if expected is None:
            continue
        ok_types = _JSON_TYPES[expected]
        # bool is an int in Python but not in JSON.
        if isinstance(value, bool) and bool not in ok_types:
            return f"argument {key!r} must be {expected}, got boolean"
        if not isinstance(value, ok_types):
            return f"argument {key!r} must be {expected}, got {type(value).__name__}"
        if "enum" in properties[key] and value not in properties[key]["enum"]:
            return f"argument {key!r} must be one of {properties[key]['enum']}"
    return None
