"""A response's ``output`` items, built from the job's text: one builder for the
streamed events and for the whole body, so a stream always assembles to what
``GET /v1/responses/{id}`` returns.

The text goes through the request's tool-call parser (none without tools):
consecutive content becomes one ``message`` item, each call a ``function_call``
item. Ids are functions of the job id and the item's position, so every gateway
process builds the same items (and the same events) from the same reply stream.
A thinking model's ``<think>`` block (the request's reasoning family, as on the chat
route) comes first as a ``reasoning`` item (its text in ``content``, type
``reasoning_text``; no ``summary``: nothing summarises it), streamed as
``response.reasoning_text.delta`` events.
"""
from __future__ import annotations

from typing import Optional

from inferq.schemas.fold import Assembly
from inferq.schemas.reasoning import ReasoningFormat, ReasoningSplitter
from inferq.producer.gateway.openai_tools import ToolPlan
from inferq.producer.gateway.tool_parsers import ArgsDelta, CallStart, Content


class OutputBuilder:
    """Feed the job's text piece by piece; each call returns the stream events
    (without ``sequence_number``) the piece adds. ``items`` is the output so far."""

    def __init__(self, job_id: str, plan: Optional[ToolPlan], reasoning: Optional[ReasoningFormat] = None):
        self.job_id = job_id
        self.splitter = ReasoningSplitter(reasoning) if reasoning is not None else None
        self.parser = plan.new_stream() if plan is not None else None
        self.max_calls = plan.max_calls if plan is not None else None
        self.items: list[dict] = []
        self._open: Optional[int] = None  # output index of the item being written
        self._skipping = False            # inside a call beyond max_calls (parallel_tool_calls false)

    def feed(self, text: str) -> list[dict]:
        if not text:
            return []
        if self.splitter is None:
            return self._content(text)
        thought, answer = self.splitter.feed(text)
        return self._reasoning(thought) + self._content(answer)

    def finish(self, item_status: str = "completed") -> list[dict]:
        """The text has ended: what the splitter and the parser still held, then the last item closes."""
        events: list[dict] = []
        if self.splitter is not None:
            thought, answer = self.splitter.finish()
            events += self._reasoning(thought) + self._content(answer)
        events += self._apply(self.parser.finish()) if self.parser is not None else []
        return events + self._close(item_status)

    def _content(self, text: str) -> list[dict]:
        if not text:
            return []
        return self._apply(self.parser.feed(text) if self.parser is not None else [Content(text)])

    @property
    def called(self) -> bool:
        return any(item["type"] == "function_call" for item in self.items)

    # -- events ---------------------------------------------------------------------
    def _apply(self, parsed) -> list[dict]:
        out: list[dict] = []
        for ev in parsed:
            if isinstance(ev, Content):
                if not ev.text:
                    continue
                if self._open is None or self.items[self._open]["type"] != "message":
                    out += self._close("completed")
                    out += self._open_message()
                out += self._text(ev.text)
            elif isinstance(ev, CallStart):
                out += self._close("completed")
                self._skipping = self.max_calls is not None and ev.index >= self.max_calls
                if not self._skipping:
                    out += self._open_call(ev)
            elif isinstance(ev, ArgsDelta) and not self._skipping and self._open is not None:
                item = self.items[self._open]
                item["arguments"] += ev.text
                out.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                            "output_index": self._open, "delta": ev.text})
        return out

    def _reasoning(self, text: str) -> list[dict]:
        if not text:
            return []
        out: list[dict] = []
        if self._open is None or self.items[self._open]["type"] != "reasoning":
            out += self._close("completed")
            index = len(self.items)
            item = {"id": f"rs_{self.job_id}_{index}", "type": "reasoning", "status": "in_progress", "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}]}
            self.items.append(item)
            self._open = index
            out += [{"type": "response.output_item.added", "output_index": index, "item": {**item, "content": []}},
                    {"type": "response.content_part.added", "item_id": item["id"], "output_index": index,
                     "content_index": 0, "part": {"type": "reasoning_text", "text": ""}}]
        item = self.items[self._open]
        item["content"][0]["text"] += text
        out.append({"type": "response.reasoning_text.delta", "item_id": item["id"], "output_index": self._open,
                    "content_index": 0, "delta": text})
        return out

    def _open_message(self) -> list[dict]:
        index = len(self.items)
        item = {"id": f"msg_{self.job_id}_{index}", "type": "message", "status": "in_progress", "role": "assistant",
                "content": []}
        self.items.append(item)
        self._open = index
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item["content"].append(part)
        return [{"type": "response.output_item.added", "output_index": index,
                 "item": {**item, "content": []}},
                {"type": "response.content_part.added", "item_id": item["id"], "output_index": index,
                 "content_index": 0, "part": dict(part)}]

    def _text(self, text: str) -> list[dict]:
        item = self.items[self._open]
        item["content"][0]["text"] += text
        return [{"type": "response.output_text.delta", "item_id": item["id"], "output_index": self._open,
                 "content_index": 0, "delta": text, "logprobs": []}]

    def _open_call(self, ev: CallStart) -> list[dict]:
        index = len(self.items)
        # The parser's own call ids are random: these are the same in every process.
        item = {"id": f"fc_{self.job_id}_{index}", "type": "function_call", "status": "in_progress",
                "call_id": f"call_{self.job_id}_{index}", "name": ev.name, "arguments": ""}
        self.items.append(item)
        self._open = index
        return [{"type": "response.output_item.added", "output_index": index, "item": dict(item)}]

    def _close(self, status: str) -> list[dict]:
        if self._open is None:
            return []
        index, item = self._open, self.items[self._open]
        self._open = None
        item["status"] = status
        if item["type"] == "reasoning":
            part = item["content"][0]
            return [{"type": "response.reasoning_text.done", "item_id": item["id"], "output_index": index,
                     "content_index": 0, "text": part["text"]},
                    {"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                     "content_index": 0, "part": dict(part)},
                    {"type": "response.output_item.done", "output_index": index, "item": _copy(item)}]
        if item["type"] == "message":
            part = item["content"][0]
            return [{"type": "response.output_text.done", "item_id": item["id"], "output_index": index,
                     "content_index": 0, "text": part["text"], "logprobs": []},
                    {"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                     "content_index": 0, "part": dict(part)},
                    {"type": "response.output_item.done", "output_index": index, "item": _copy(item)}]
        return [{"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": index,
                 "name": item["name"], "arguments": item["arguments"]},
                {"type": "response.output_item.done", "output_index": index, "item": _copy(item)}]


def _copy(item: dict) -> dict:
    out = dict(item)
    if "content" in out:
        out["content"] = [dict(p) for p in out["content"]]
    return out


def output_items(job_id: str, plan: Optional[ToolPlan], asm: Assembly, item_status: str = "completed",
                 reasoning: Optional[ReasoningFormat] = None) -> list[dict]:
    """The ``output`` list of a response from its folded job output."""
    builder = OutputBuilder(job_id, plan, reasoning)
    builder.feed(asm.text)
    builder.finish(item_status)
    return builder.items
