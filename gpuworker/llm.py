"""Offline API: ``LLM().generate(prompts, params)``, vLLM's shape."""
from __future__ import annotations

from typing import Optional, Sequence, Union

from inferq.gpuworker.config import EngineConfig
from inferq.gpuworker.engine.llm_engine import LLMEngine
from inferq.gpuworker.engine.outputs import CompletionOutput, EmbeddingOutput
from inferq.gpuworker.engine.pooling import Pooling
from inferq.schemas import SamplingParams

Prompt = Union[str, list[int]]


class LLM:
    """Load a model once and generate for batches of prompts.

    ``LLM()`` serves the bundled SmolLM2-135M-Instruct; pass ``model=`` a Hugging
    Face folder or a ``.gguf`` file for another Llama-family model. Keyword
    arguments are ``EngineConfig`` fields.
    """

    def __init__(self, model: Optional[str] = None, **kwargs):
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs))
        self._next_id = 0

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt).input_ids)
        return list(prompt)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def embed(self, prompts: Union[Prompt, Sequence[Prompt]], pooling: Optional[str] = None,
              normalize: bool = True) -> list[EmbeddingOutput]:
        """One vector per prompt, in order: the final hidden states pooled ("mean" or
        "last"; None: the engine's ``pooling`` setting), L2-normalised unless told not to.
        The prompts run as one continuous batch, as the worker runs embed jobs."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        spec = Pooling(kind=pooling, normalize=normalize)
        engine = self.engine
        order, ids_of, vectors = [], {}, {}
        for prompt in prompts:
            rid = f"llm-{self._next_id}"
            self._next_id += 1
            ids_of[rid] = self.encode(prompt)
            engine.add_request(rid, ids_of[rid], pooling=spec)
            order.append(rid)
        while engine.has_unfinished():
            for d in engine.step():
                if d.finished:
                    vectors[d.request_id] = d.embedding
        return [EmbeddingOutput(rid, ids_of[rid], vectors[rid].tolist()) for rid in order]

    def generate(
        self,
        prompts: Union[Prompt, Sequence[Prompt]],
        params: Union[None, SamplingParams, Sequence[SamplingParams]] = None,
        priorities: Optional[Sequence[int]] = None,
    ) -> list[CompletionOutput]:
        """One output per prompt, in order. With ``n > 1`` each output carries
        the other samples in ``.samples`` (the first sample is the output itself)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        priorities = list(priorities) if priorities is not None else [0] * len(prompts)

        engine = self.engine
        plan: list[list[str]] = []  # request ids of each prompt's samples
        state: dict[str, dict] = {}
        for prompt, p, prio in zip(prompts, params, priorities):
            if p.ranks_choices:
                raise ValueError("LLM.generate does not rank best_of > n sequences; queue the job (the worker does)")
            ids = self.encode(prompt)
            rids = []
            for k in range(p.n):
                rid = f"llm-{self._next_id}"
                self._next_id += 1
                sp = p
                if p.n > 1:  # each sample is its own request; seeded samples get distinct seeds
                    sp = p.model_copy(update={"n": 1, "best_of": None, "seed": None if p.seed is None else p.seed + k})
                engine.add_request(rid, ids, sp, priority=prio)
                state[rid] = {"prompt": ids, "tokens": [], "text": [], "logprobs": [], "reason": None}
                rids.append(rid)
            plan.append(rids)

        while engine.has_unfinished():
            for d in engine.step():
                st = state[d.request_id]
                st["tokens"].extend(d.new_token_ids)
                st["text"].append(d.new_text)
                if d.logprobs:
                    st["logprobs"].extend(d.logprobs)
                if d.prompt_logprobs is not None:
                    st["prompt_logprobs"] = d.prompt_logprobs
                if d.finished:
                    st["reason"] = d.finish_reason
                    st["cached"] = d.num_cached_tokens

        results = []
        for rids, p in zip(plan, params):
            outs = [
                CompletionOutput(
                    request_id=rid,
                    prompt_token_ids=state[rid]["prompt"],
                    token_ids=state[rid]["tokens"],
                    text="".join(state[rid]["text"]),
                    finish_reason=state[rid]["reason"],
                    logprobs=state[rid]["logprobs"] if p.logprobs is not None else None,
                    num_cached_tokens=state[rid].get("cached", 0),
                    prompt_logprobs=state[rid].get("prompt_logprobs"),
                )
                for rid in rids
            ]
            outs[0].samples = outs
            results.append(outs[0])
        return results
