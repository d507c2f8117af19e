"""Jobs of task ``tokenize`` and ``detokenize``, answered by the intake with the
model's own tokenizer and chat template, without an engine step: the gateway has
no model files, so /tokenize and /detokenize come here through the queue."""
from __future__ import annotations

from inferq.schemas.job import Job, TokenizeOptions

from inferq.gpuworker.service.prompts import PromptBuilder, PromptError


def answer(job: Job, prompts: PromptBuilder) -> tuple[str, list[int]]:
    """(text, token ids) of a tokenize or detokenize job; PromptError when it cannot be done."""
    tok = prompts.tok
    if job.task == "detokenize":
        ids = list(job.prompt_token_ids)
        bad = [t for t in ids if t >= prompts.vocab_size]
        if bad:
            raise PromptError("invalid_prompt", f"token ids must be below the vocabulary size {prompts.vocab_size}; "
                                                f"got {bad[0]}")
        try:
            return tok.decode(ids), ids
        except Exception as e:  # ids the tokenizer has no piece for
            raise PromptError("invalid_prompt", f"detokenization failed: {e}") from None
    opts = job.tokenize or TokenizeOptions()
    if job.prompt is not None:
        add_special = True if opts.add_special_tokens is None else opts.add_special_tokens
        return "", list(tok(job.prompt, add_special_tokens=add_special).input_ids)
    if not getattr(tok, "chat_template", None):
        raise PromptError("no_chat_template", "this model has no chat template: send 'prompt' instead of 'messages'")
    try:
        text = tok.apply_chat_template([m.model_dump() for m in job.messages], tokenize=False,
                                       add_generation_prompt=opts.add_generation_prompt)
    except Exception as e:  # template errors (e.g. unsupported roles) are the client's
        raise PromptError("invalid_messages", f"chat template failed: {e}") from None
    return "", list(tok(text, add_special_tokens=bool(opts.add_special_tokens)).input_ids)
