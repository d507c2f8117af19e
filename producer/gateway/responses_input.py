"""A Responses request's ``input`` as items (what ``GET /v1/responses/{id}/input_items``
lists) and as the chat messages the worker renders with the model's template.

Accepted items: messages (a string, or ``input_text`` / ``output_text`` parts;
roles user, system, developer, assistant), ``function_call`` and
``function_call_output`` (a tool round trip). Images, files, audio, item
references and built-in tool items are refused with a 400 naming them.
"""
from __future__ import annotations

import json
from typing import Any, Union

from inferq.producer.gateway.errors import bad_request

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text")
# Items the model wrote that carry nothing a chat template renders (reasoning is
# dropped from earlier turns by the templates that have it).
_SKIPPED = ("reasoning",)


def normalize_input(raw: Union[str, list[dict[str, Any]], None], job_id: str) -> list[dict]:
    """The request's input as OpenAI input items, each with an ``id``."""
    if raw is None:
        return []
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    items = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise bad_request(f"input[{i}] must be an object", param=f"input[{i}]")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            items.append(_message(item, i, job_id))
        elif kind == "function_call":
            items.append(_function_call(item, i, job_id))
        elif kind == "function_call_output":
            items.append(_function_call_output(item, i, job_id))
        elif kind in _SKIPPED:
            continue
        else:
            raise bad_request(f"input[{i}]: items of type '{kind}' are not supported; send messages, function_call "
                              "and function_call_output items", param=f"input[{i}].type", code="unsupported_parameter")
    return items


def _message(item: dict, i: int, job_id: str) -> dict:
    role = item.get("role")
    if role not in _ROLES:
        raise bad_request(f"input[{i}].role must be one of {', '.join(_ROLES)}", param=f"input[{i}].role")
    content = item.get("content")
    part_type = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        parts = [{"type": part_type, "text": content}]
    elif isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
                raise bad_request(f"input[{i}].content[{k}]: content of type '{kind}' is not supported; only text "
                                  "(input_text)", param=f"input[{i}].content[{k}].type", code="unsupported_parameter")
            parts.append({"type": part_type, "text": part["text"]} if kind == "text" else
                         {"type": kind, "text": part["text"]})
    else:
        raise bad_request(f"input[{i}].content must be a string or a list of input_text parts",
                          param=f"input[{i}].content")
    for p in parts:
        if p["type"] == "output_text":
            p.setdefault("annotations", [])
    return {"type": "message", "id": item.get("id") or f"msg_{job_id}_in{i}", "role": role, "content": parts,
            "status": "completed"}


def _function_call(item: dict, i: int, job_id: str) -> dict:
    call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise bad_request(f"input[{i}]: a function_call item needs call_id and name", param=f"input[{i}]")
    if not isinstance(args, str):
        args = json.dumps(args)
    return {"type": "function_call", "id": item.get("id") or f"fc_{job_id}_in{i}", "call_id": call_id, "name": name,
            "arguments": args, "status": "completed"}


def _function_call_output(item: dict, i: int, job_id: str) -> dict:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(f"input[{i}]: a function_call_output item needs the call_id it answers",
                          param=f"input[{i}].call_id")
    if isinstance(output, list):  # a list of input_text parts
        texts = []
        for part in output:
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
                raise bad_request(f"input[{i}].output: only text output is supported", param=f"input[{i}].output",
                                  code="unsupported_parameter")
            texts.append(part.get("text") or "")
        output = "".join(texts)
    if not isinstance(output, str):
        raise bad_request(f"input[{i}].output must be a string", param=f"input[{i}].output")
    return {"type": "function_call_output", "id": item.get("id") or f"fco_{job_id}_in{i}", "call_id": call_id,
            "output": output, "status": "completed"}


def items_to_messages(items: list[dict], before: tuple[dict, ...] | list[dict] = ()) -> list[dict]:
    """Input (or earlier output) items as chat messages: consecutive function calls
    join the assistant turn before them, each output becomes a ``tool`` turn (named
    after its call, which may be in the messages ``before`` these)."""
    messages: list[dict] = []
    names: dict[str, str] = {c["id"]: c["function"]["name"] for m in before for c in m.get("tool_calls") or []}
    for item in items:
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            text = "".join(p.get("text") or "" for p in item["content"] if p.get("type") in _TEXT_PARTS)
            messages.append({"role": role, "content": text})
        elif kind == "function_call":
            names[item["call_id"]] = item["name"]
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            msg = {"role": "tool", "content": item["output"], "tool_call_id": item["call_id"]}
            if item["call_id"] in names:
                msg["name"] = names[item["call_id"]]
            messages.append(msg)
    return messages
