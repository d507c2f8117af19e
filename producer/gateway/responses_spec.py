"""What a response is, apart from its job's output: the request's echo, its own input
items and the conversation it continues. Stored in Redis (responses_store.py) so any
gateway process can answer for it; for ``store: false`` it lives only in the request."""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, Field

from inferq.schemas.reasoning import ReasoningFormat, reasoning_format
from inferq.producer.gateway.openai_tools import FunctionDef, NamedToolChoice, ToolDef, ToolPlan, plan_tools


def response_id(job_id: str) -> str:
    return "resp_" + job_id


def job_id_of(resp_id: str) -> Optional[str]:
    return resp_id[len("resp_"):] if resp_id.startswith("resp_") and len(resp_id) > 5 else None


class ResponseSpec(BaseModel):
    job_id: str
    model: str
    created_at: int
    tenant: Optional[str] = None
    background: bool = False
    store: bool = True
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = None
    temperature: float = 1.0
    top_p: float = 1.0
    text_format: dict[str, Any] = Field(default_factory=lambda: {"type": "text"})
    tools: list[dict[str, Any]] = Field(default_factory=list)   # as the request gave them (Responses shape)
    tool_choice: Union[str, dict[str, Any]] = "auto"
    parallel_tool_calls: bool = True
    tool_parser: str = "auto"
    reasoning_parser: Optional[str] = None  # the model's reasoning family when the response was made
    metadata: dict[str, str] = Field(default_factory=dict)
    previous_response_id: Optional[str] = None
    user: Optional[str] = None
    service_tier: Optional[str] = None
    input_items: list[dict[str, Any]] = Field(default_factory=list)
    # The chat messages this response continued and added (without instructions, which
    # a later response in the chain does not inherit).
    conversation: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def id(self) -> str:
        return response_id(self.job_id)

    def reasoning_format(self) -> Optional[ReasoningFormat]:
        try:
            return reasoning_format(self.reasoning_parser)
        except ValueError:  # stored by a gateway that knew a family this one does not: no split
            return None

    def tool_plan(self) -> Optional[ToolPlan]:
        """The request's tools as the chat route plans them (rebuilt the same in any process)."""
        defs = [ToolDef(type="function", function=FunctionDef(name=t["name"], description=t.get("description"),
                                                               parameters=t.get("parameters"), strict=t.get("strict")))
                for t in self.tools]
        choice = self.tool_choice
        if isinstance(choice, dict):
            choice = NamedToolChoice(type="function", function={"name": choice.get("name", "")})
        return plan_tools(defs, choice, self.parallel_tool_calls, self.tool_parser)
