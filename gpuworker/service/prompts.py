"""Turn a job into prompt token ids (chat template for ``messages``), with the
checks that give a clear error instead of a failed engine step."""
from __future__ import annotations

from schemas.job import Job


class PromptError(ValueError):
    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(message)


class PromptBuilder:
    def __init__(self, tokenizer, max_model_len: int, vocab_size: int):
        # The intake thread owns this tokenizer; the engine thread detokenizes
        # with its own (HF fast tokenizers are not safe to share across threads).
        self.tok = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

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
                text = self.tok.apply_chat_template(
                    [m.model_dump() for m in job.messages], tokenize=False, add_generation_prompt=True
                )
            except Exception as e:  # template errors (e.g. unsupported roles) are the client's
                raise PromptError("invalid_messages", f"chat template failed: {e}") from None
            ids = list(self.tok(text, add_special_tokens=False).input_ids)
        if not ids:
            raise PromptError("empty_prompt", "the prompt is empty after tokenization")
        if len(ids) >= self.max_model_len:
            raise PromptError(
                "prompt_too_long",
                f"the prompt has {len(ids)} tokens, but this model allows at most {self.max_model_len - 1} "
                f"prompt tokens (max_model_len {self.max_model_len})",
            )
        return ids
