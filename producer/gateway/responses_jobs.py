"""How a Responses request becomes a chat Job on the queue (the same lanes, tenants,
fencing and reply streams as ``/v1/chat/completions``), plus the response's spec.

``instructions`` become a system message; ``previous_response_id`` puts the stored
chain's conversation (and the previous response's output) first; ``text.format``
is the chat route's ``response_format`` constraint; function tools and
``tool_choice`` are planned by openai_tools exactly as for chat.
"""
from __future__ import annotations

import time
from typing import Awaitable, Callable, Optional

from inferq.schemas import Job, SamplingParams
from inferq.schemas.job import new_job_id
from inferq.producer.gateway.errors import bad_request
from inferq.producer.gateway.openai_schemas import check_prompt_size
from inferq.producer.gateway.openai_structured import JsonSchemaFormat, ResponseFormat, StructuredFields
from inferq.producer.gateway.responses_input import items_to_messages, normalize_input
from inferq.producer.gateway.responses_schemas import ResponseRequest, refuse_unsupported
from inferq.producer.gateway.responses_spec import ResponseSpec
from inferq.producer.gateway.reasoning import families
from inferq.producer.gateway.runner import Context, make_job

Resolver = Callable[[Optional[str]], Awaitable[str]]
# The conversation a previous response leaves (its chain, its input and its output).
ChainReader = Callable[[str], Awaitable[list[dict]]]

ROUTE = "responses"  # the job's metadata["route"]


def _tool_choice(raw) -> object:
    if raw is None:
        return "auto"
    if isinstance(raw, str):
        if raw not in ("auto", "none", "required"):
            raise bad_request("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
                              param="tool_choice")
        return raw
    if raw.get("type") != "function" or not isinstance(raw.get("name"), str):
        raise bad_request(f"tool_choice of type '{raw.get('type')}' is not supported; use 'auto', 'none', 'required' "
                          "or {'type': 'function', 'name': ...}", param="tool_choice", code="unsupported_parameter")
    return {"type": "function", "name": raw["name"]}


def _constraint(req: ResponseRequest):
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        rf = ResponseFormat(type="json_object")
    else:
        if fmt.schema_ is None:
            raise bad_request("text.format of type json_schema needs a schema", param="text.format.schema")
        rf = ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(name=fmt.name or "response",
                                                                             schema=fmt.schema_, strict=fmt.strict))
    try:
        return StructuredFields(response_format=rf).constraint()
    except Exception as e:  # the chat route's 400 names response_format: say text.format
        if hasattr(e, "param"):
            e.param = "text.format"
            e.message = e.message.replace("response_format", "text.format")
        raise


async def prepare_response(ctx: Context, req: ResponseRequest, resolve: Resolver, chain: ChainReader, *,
                           tenant: Optional[str]) -> tuple[ResponseSpec, Job]:
    refuse_unsupported(req)
    background, store = bool(req.background), req.store is not False
    if background and not store:
        raise bad_request("background mode needs store: true (a background response is read back later)",
                          param="background")
    if req.max_output_tokens is not None and req.max_output_tokens > ctx.settings.max_tokens_cap:
        raise bad_request(f"max_output_tokens={req.max_output_tokens} exceeds this gateway's cap of "
                          f"{ctx.settings.max_tokens_cap}", param="max_output_tokens")
    job_id = new_job_id()
    items = normalize_input(req.input, job_id)
    if not items and req.previous_response_id is None:
        raise bad_request("input must not be empty", param="input")
    conversation = await chain(req.previous_response_id) if req.previous_response_id else []
    conversation = conversation + items_to_messages(items, conversation)
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + conversation
    if not messages:
        raise bad_request("input must not be empty", param="input")
    check_prompt_size(ctx.settings, messages=messages)

    model = await resolve(req.model)
    thinking = await families(ctx).of(model)
    fmt = req.text.format if req.text is not None and req.text.format is not None else None
    spec = ResponseSpec(
        job_id=job_id, model=model, created_at=int(time.time()), tenant=tenant, background=background, store=store,
        instructions=req.instructions, max_output_tokens=req.max_output_tokens,
        temperature=1.0 if req.temperature is None else req.temperature, top_p=1.0 if req.top_p is None else req.top_p,
        text_format=fmt.echo() if fmt is not None else {"type": "text"},
        tools=[t.echo() for t in req.tools or []], tool_choice=_tool_choice(req.tool_choice),
        parallel_tool_calls=req.parallel_tool_calls is not False, tool_parser=ctx.settings.tool_parser,
        reasoning_parser=thinking.name if thinking is not None else None,
        metadata=req.metadata or {}, previous_response_id=req.previous_response_id, user=req.user,
        service_tier=req.service_tier, input_items=items, conversation=conversation)

    fields = {"temperature": req.temperature, "top_p": req.top_p, "seed": req.seed, "ignore_eos": req.ignore_eos,
              "max_tokens": req.max_output_tokens or min(ctx.settings.default_max_tokens, ctx.settings.max_tokens_cap)}
    constraint = _constraint(req)
    if constraint is not None:
        fields["structured_outputs"] = constraint
    try:
        sampling = SamplingParams(**{k: v for k, v in fields.items() if v is not None})
    except ValueError as e:
        raise bad_request(f"invalid sampling parameters: {e}") from None
    plan = spec.tool_plan()
    if plan is not None:
        sampling = plan.sampling(sampling)
    timeout = ctx.settings.responses_background_timeout_s if background else ctx.settings.request_timeout_s
    job = make_job(id=job_id, model=model, messages=messages, sampling=sampling,
                   tools=plan.job_tools() if plan else None, priority=req.priority, tenant=tenant,
                   deadline=time.time() + timeout,
                   priority_class="batch" if req.service_tier == "flex" else "interactive",
                   session_id=req.session_id, metadata={"route": ROUTE})
    return spec, job
