"""The one interface a proposer implements (n-gram today, a draft model, EAGLE-style heads later)."""
from __future__ import annotations

from abc import ABC, abstractmethod

from inferq.gpuworker.engine.request import Request


class Proposer(ABC):
    @abstractmethod
    def propose(self, requests: list[Request], limits: list[int]) -> list[list[int]]:
        """Up to ``limits[i]`` draft tokens to follow ``requests[i].all_token_ids``
        (an empty list: nothing to propose). Called once per step, before scheduling,
        for the requests that speculate this step; every request is decoding (its
        last known token is the only one without KV)."""

    def accepted(self, req: Request, num_proposed: int, num_accepted: int) -> None:
        """The verification of ``req``'s proposal kept ``num_accepted`` of ``num_proposed``."""

    def finished(self, request_id: str) -> None:
        """A request left the engine: drop whatever the proposer kept for it."""
