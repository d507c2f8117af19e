"""How an OpenAI request body becomes a Job, and how the job's output becomes the
response body: one place, used by the HTTP routes and by the Batch API driver,
so a batch line gives exactly the job (and body) the same request sent alone does."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable, Optional

from inferq.schemas import Job
from inferq.schemas.fold import Assembly
from inferq.schemas.reasoning import ReasoningFormat
from inferq.producer.gateway import openai_format as fmt
from inferq.producer.gateway.errors import bad_request
from inferq.producer.gateway.openai_schemas import (
    ChatCompletionRequest, CompletionRequest, build_sampling, check_prompt_size,
)
from inferq.producer.gateway.openai_tools import ToolPlan, plan_tools
from inferq.producer.gateway.reasoning import families, shape_chat_body
from inferq.producer.gateway.runner import Context, make_job

Resolver = Callable[[Optional[str]], Awaitable[str]]


@dataclass
class Prepared:
    kind: str  # "completions" | "chat"
    job: Job
    model: str
    logprobs_n: Optional[int]
    prompt_logprobs_n: Optional[int]
    prefix: str = ""  # the echoed prompt of a completion
    echo: bool = False
    echo_logprobs: bool = False
    tools: Optional[ToolPlan] = None  # chat with tools: the answer's text becomes tool_calls
    reasoning: Optional[ReasoningFormat] = None  # a thinking model: its <think> block becomes reasoning_content

    def body(self, job_id: str, asm: Assembly) -> dict:
        """The non-streaming response body of the endpoint."""
        if self.kind == "completions":
            return fmt.completion_response(job_id, self.model, asm, self.prefix, self.logprobs_n, echo=self.echo,
                                           prompt_logprobs_n=self.prompt_logprobs_n)
        body = fmt.chat_response(job_id, self.model, asm, self.logprobs_n)
        if self.reasoning is not None:  # before the tool calls: they are read from the content alone
            shape_chat_body(body, self.reasoning)
        if self.tools is not None:
            self.tools.shape_body(body)
        if self.prompt_logprobs_n is not None:  # vLLM puts them at the top of a chat response
            body["prompt_logprobs"] = fmt.prompt_logprobs_body(asm, self.prompt_logprobs_n)
        return body


async def prepare_completion(ctx: Context, req: CompletionRequest, resolve: Resolver, *, tenant: Optional[str],
                             deadline: float, priority: Optional[int] = None,
                             metadata: Optional[dict] = None, priority_class: Optional[str] = None) -> Prepared:
    if req.suffix:
        raise bad_request("suffix is not supported", param="suffix")
    text, token_ids = req.single_prompt()
    if req.echo and text is None:
        raise bad_request("echo is supported only for text prompts", param="echo")
    check_prompt_size(ctx.settings, text=text, token_ids=token_ids)
    # echo with logprobs reports the prompt's logprobs too: the worker computes them.
    prompt_lp = req.prompt_logprobs
    if req.echo and req.logprobs is not None:
        prompt_lp = max(prompt_lp or 0, req.logprobs)
    sampling = build_sampling(req, ctx.settings, req.max_tokens if req.max_tokens is not None else 16, req.logprobs,
                              prompt_lp)
    model = await resolve(req.model)
    job = make_job(model=model, prompt=text, prompt_token_ids=token_ids, sampling=sampling,
                   priority=req.priority if priority is None else priority, tenant=tenant, deadline=deadline,
                   priority_class=priority_class or req.priority_class, session_id=req.session_id,
                   metadata={"route": "completions", **(metadata or {})})
    return Prepared("completions", job, model, req.logprobs, req.prompt_logprobs,
                    prefix=text if req.echo and text else "", echo=req.echo,
                    echo_logprobs=req.echo and req.logprobs is not None)


async def prepare_chat(ctx: Context, req: ChatCompletionRequest, resolve: Resolver, *, tenant: Optional[str],
                       deadline: float, priority: Optional[int] = None, metadata: Optional[dict] = None,
                       priority_class: Optional[str] = None) -> Prepared:
    messages = req.job_messages()
    check_prompt_size(ctx.settings, messages=messages)
    logprobs_n: Optional[int] = None
    if req.logprobs:
        logprobs_n = req.top_logprobs or 0
    elif req.top_logprobs:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    sampling = build_sampling(req, ctx.settings, max_tokens, logprobs_n, req.prompt_logprobs)
    tools = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, ctx.settings.tool_parser)
    if tools is not None and req.n > 1:
        raise bad_request("n > 1 with tools is not supported: send one request per choice", param="n")
    if tools is not None:
        sampling = tools.sampling(sampling)
    model = await resolve(req.model)
    # The worker applies the model's chat template to `messages` (and `tools`).
    job = make_job(model=model, messages=messages, sampling=sampling, tools=tools.job_tools() if tools else None,
                   priority=req.priority if priority is None else priority, tenant=tenant, deadline=deadline,
                   priority_class=priority_class or req.priority_class, session_id=req.session_id,
                   chat_template_kwargs=req.chat_template_kwargs,
                   metadata={"route": "chat.completions", **(metadata or {})})
    reasoning = await families(ctx).for_request(model, req.chat_template_kwargs)
    return Prepared("chat", job, model, logprobs_n, req.prompt_logprobs, tools=tools, reasoning=reasoning)
