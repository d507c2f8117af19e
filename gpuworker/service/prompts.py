"""Turn a job into prompt token ids (chat template for ``messages``), with the
checks that give a clear error instead of a failed engine step.

Tool calling: a template that knows tools (Llama 3.x, Qwen, Mistral, ...) gets
them and the tool turns in the shapes Hugging Face templates expect. One that
does not (the bundled SmolLM2) gets a Hermes-style system block describing the
tools and asking for ``<tool_call>`` JSON, and the tool turns as text.
"""
from __future__ import annotations

import hashlib
import json
import re
import string
from typing import Optional

from inferq.schemas.job import ChatMessage, Job
from inferq.schemas.reasoning import detect_parser


class PromptError(ValueError):
    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(message)


class PromptBuilder:
    def __init__(self, tokenizer, max_model_len: int, vocab_size: int, eos_token_ids: tuple[int, ...] = ()):
        # The intake thread owns this tokenizer; the engine thread detokenizes
        # with its own (HF fast tokenizers are not safe to share across threads).
        self.tok = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)

    def token_ids(self, job: Job) -> list[int]:
        if job.prompt_token_ids is not None:
            ids = list(job.prompt_token_ids)
            bad = [t for t in ids if t >= self.vocab_size]
            if bad:
                raise PromptError("invalid_prompt", f"prompt_token_ids must be below the vocabulary size {self.vocab_size}; got {bad[0]}")
        elif job.prompt is not None:
            ids = list(self.tok(job.prompt).input_ids)
        else:
            if not getattr(self.tok, "chat_template", None):
                raise PromptError("no_chat_template", "this model has no chat template: send 'prompt' instead of 'messages'")
            try:
                text = self._chat_text(job)
            except Exception as e:  # template errors (e.g. unsupported roles) are the client's
                raise PromptError("invalid_messages", f"chat template failed: {e}") from None
            ids = list(self.tok(text, add_special_tokens=False).input_ids)
        if not ids:
            raise PromptError("empty_prompt", "the prompt is empty after tokenization")
        if job.task == "embed":  # nothing is generated: the input may fill the context
            if len(ids) > self.max_model_len:
                raise PromptError("prompt_too_long", f"the input has {len(ids)} tokens, but this model's context is "
                                                     f"{self.max_model_len} tokens (max_model_len)")
        elif len(ids) >= self.max_model_len:
            raise PromptError(
                "prompt_too_long",
                f"the prompt has {len(ids)} tokens, but this model allows at most {self.max_model_len - 1} "
                f"prompt tokens (max_model_len {self.max_model_len})",
            )
        return ids

    def _chat_text(self, job: Job) -> str:
        messages, tools = job.messages, job.tools
        # The request's template variables (e.g. Qwen3's enable_thinking); the job's
        # schema refuses the names apply_chat_template takes itself.
        extra = job.chat_template_kwargs or {}
        if not tools and not any(m.tool_calls or m.role == "tool" for m in messages):
            return self.tok.apply_chat_template([m.model_dump() for m in messages], tokenize=False,
                                                add_generation_prompt=True, **extra)
        if template_knows_tools(self.tok.chat_template):
            return self.tok.apply_chat_template([template_message(m) for m in messages], tools=tools,
                                                tokenize=False, add_generation_prompt=True, **extra)
        return self.tok.apply_chat_template(fallback_messages(messages, tools), tokenize=False,
                                            add_generation_prompt=True, **extra)


def reasoning_family(setting: str, tokenizer) -> str:
    """The reasoning family a model's outputs are split by: the setting when it names
    one, else detected from the chat template and the generation prompt it renders
    (a template that opens ``<think>`` there is ``deepseek_r1``-style)."""
    name = (setting or "").strip().lower()
    if name != "auto":
        return name or "none"
    template = getattr(tokenizer, "chat_template", None)
    try:
        opening = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                                add_generation_prompt=True)
    except Exception:  # a template that needs more (a system turn, tools): the template alone decides
        opening = ""
    return detect_parser(template if isinstance(template, str) else None, opening) or "none"


_TOOLS_WORD = re.compile(r"\btools\b")


def template_knows_tools(template) -> bool:
    """Templates that render tools read a ``tools`` variable."""
    if isinstance(template, dict):  # named templates: the default one, or a "tool_use" one
        template = template.get("tool_use") or template.get("default")
    return isinstance(template, str) and bool(_TOOLS_WORD.search(template))


def _arguments(text: str):
    """HF templates write ``arguments | tojson``: they want the object, not its text."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return text
    return value if isinstance(value, dict) else text


_ID_CHARS = string.ascii_letters + string.digits


def template_call_id(call_id: Optional[str]) -> Optional[str]:
    """Mistral's templates refuse ids that are not 9 letters or digits; OpenAI's
    ("call_...") are longer. A call and its answer map to the same short id."""
    if call_id is None or (len(call_id) == 9 and call_id.isalnum()):
        return call_id
    digest = hashlib.sha256(call_id.encode()).digest()
    return "".join(_ID_CHARS[b % len(_ID_CHARS)] for b in digest[:9])


def template_message(m: ChatMessage) -> dict:
    msg: dict = {"role": m.role, "content": m.content}
    if m.tool_calls:
        msg["tool_calls"] = [
            {"id": template_call_id(c.get("id")), "type": "function",
             "function": {"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))}}
            for c in m.tool_calls
        ]
    if m.role == "tool":
        msg["tool_call_id"] = template_call_id(m.tool_call_id)
        if m.name:
            msg["name"] = m.name
    return msg


def tools_block(tools: list[dict]) -> str:
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call functions to help with the user's request. They are described inside "
            f"<tools></tools>, one JSON object each:\n<tools>\n{listed}\n</tools>\n\n"
            "To call a function, answer with a JSON object for each call inside <tool_call></tool_call> tags:\n"
            '<tool_call>\n{"name": <function name>, "arguments": <arguments as a JSON object>}\n</tool_call>')


def _call_text(call: dict) -> str:
    fn = call["function"]
    body = {"name": fn["name"], "arguments": _arguments(fn.get("arguments"))}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"


def fallback_messages(messages: list[ChatMessage], tools: Optional[list[dict]]) -> list[dict]:
    """For a template without tool support: tools in the system message, calls
    and answers as text (answers as a user turn, since such templates may know
    no ``tool`` role); consecutive answers share one turn."""
    out: list[dict] = []
    for m in messages:
        if m.role == "tool":
            answer = f"<tool_response>\n{m.content}\n</tool_response>"
            if out and out[-1].get("_answers"):
                out[-1]["content"] += "\n" + answer
            else:
                out.append({"role": "user", "content": answer, "_answers": True})
            continue
        content = m.content
        if m.tool_calls:
            content = "\n".join(([content] if content else []) + [_call_text(c) for c in m.tool_calls])
        out.append({"role": m.role, "content": content})
    if tools:
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{tools_block(tools)}"
        else:
            out.insert(0, {"role": "system", "content": tools_block(tools)})
    return [{"role": m["role"], "content": m["content"]} for m in out]
