"""JSON Schemas and prompts that the structured-output tests (engine and gateway) and
`inferq bench structured` share.

Every schema is bounded (string lengths, array sizes) so that a complete answer
fits in the tests' token budget, and together they cover nested objects, arrays
with min/max items, enums, const, numbers with ranges, string patterns and
lengths, nullable fields and ``additionalProperties: false``.
"""
from __future__ import annotations

NAME = {"type": "string", "minLength": 1, "maxLength": 24}

SCHEMAS: dict[str, dict] = {
    "person": {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"], "additionalProperties": False,
    },
    "nested_address": {
        "type": "object",
        "properties": {
            "name": NAME,
            "address": {
                "type": "object",
                "properties": {"city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False,
            },
        },
        "required": ["name", "address"], "additionalProperties": False,
    },
    "tags_array": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 4}},
        "required": ["tags"], "additionalProperties": False,
    },
    "enum_colour": {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}, "shade": {"type": "string", "enum": ["light", "dark"]}},
        "required": ["colour", "shade"], "additionalProperties": False,
    },
    "const_version": {
        "type": "object",
        "properties": {"version": {"const": 2}, "kind": {"const": "report"}, "title": NAME},
        "required": ["version", "kind", "title"], "additionalProperties": False,
    },
    "number_ranges": {
        "type": "object",
        "properties": {
            "temperature": {"type": "number", "minimum": -50, "maximum": 60},
            "humidity": {"type": "integer", "minimum": 0, "maximum": 100},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        },
        "required": ["temperature", "humidity", "ratio"], "additionalProperties": False,
    },
    "string_pattern": {
        "type": "object",
        "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "code": {"type": "string", "minLength": 2, "maxLength": 6},
        },
        "required": ["sku", "code"], "additionalProperties": False,
    },
    "nullable_fields": {
        "type": "object",
        "properties": {
            "nickname": {"anyOf": [{"type": "string", "maxLength": 16}, {"type": "null"}]},
            "score": {"type": ["integer", "null"], "minimum": 0, "maximum": 10},
        },
        "required": ["nickname", "score"], "additionalProperties": False,
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array", "minItems": 1, "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"name": NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                    "required": ["name", "qty"], "additionalProperties": False,
                },
            },
        },
        "required": ["items"], "additionalProperties": False,
    },
    "boolean_and_defs": {
        "$defs": {"flag": {"type": "boolean"}},
        "type": "object",
        "properties": {"done": {"$ref": "#/$defs/flag"}, "note": {"type": "string", "maxLength": 20}},
        "required": ["done", "note"], "additionalProperties": False,
    },
    "top_level_array": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 3, "maxItems": 5,
    },
}

PROMPTS: dict[str, str] = {
    "person": "Describe a fictional person as JSON with a name and an age.",
    "nested_address": "Give a person's name and address (city and 5-digit zip) as JSON.",
    "tags_array": "List some tags for a blog post about cooking, as JSON.",
    "enum_colour": "Pick a colour and a shade, as JSON.",
    "const_version": "Write a report header as JSON.",
    "number_ranges": "Report the weather (temperature, humidity, a ratio) as JSON.",
    "string_pattern": "Give a product SKU and a short code as JSON.",
    "nullable_fields": "Give a nickname and a score as JSON (either may be null).",
    "array_of_objects": "List a few groceries with quantities as JSON.",
    "boolean_and_defs": "Say whether the task is done, with a short note, as JSON.",
    "top_level_array": "Give a few small numbers as a JSON array.",
}
