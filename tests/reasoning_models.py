"""Tiny random "thinking" models: the tiny Qwen3-shaped folder (tests/tiny_models.py)
with ``<think>`` and ``</think>`` as single tokens of its tokenizer (as in Qwen3 and
DeepSeek-R1, where they are added tokens that are not special, so they show in the
text) and a chat template of either family:

* ``QWEN3_TEMPLATE``: Qwen3's generation prompt; ``enable_thinking=false`` closes an
  empty block in the prompt (``<think>\\n\\n</think>\\n\\n``).
* ``R1_TEMPLATE``: DeepSeek-R1's: the generation prompt opens ``<think>\\n``.
* ``SWITCH_TEMPLATE``: opens the block as R1's does, or closes an empty one with
  ``enable_thinking=false``.

Two rarely used special tokens of the SmolLM2 tokenizer (ids 3 and 4) are renamed,
so the vocabulary (and the model's embedding) keeps its size.
"""
from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_models import save_tiny_model

THINK_ID, END_THINK_ID = 3, 4

_TURNS = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] "
          "+ '<|im_end|>\\n' }}{%- endfor %}")
QWEN3_TEMPLATE = (_TURNS + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                  "{%- if enable_thinking is defined and enable_thinking is false %}"
                  "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
R1_TEMPLATE = _TURNS + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
# Opens the block unless told not to think (a thinking model with a switch): detected as
# deepseek_r1, and enable_thinking=false closes an empty block instead.
SWITCH_TEMPLATE = (_TURNS + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                   "{%- if enable_thinking is defined and enable_thinking is false %}"
                   "{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}")


def save_thinking_model(folder: Path, template: str, seed: int = 0, **overrides) -> Path:
    """``overrides`` go to the transformers config: ``tie_word_embeddings=False`` gives
    varied greedy text (tied, the random model mostly repeats its last prompt token)."""
    folder = save_tiny_model("qwen3", Path(folder), seed=seed, **overrides)
    path = folder / "tokenizer.json"
    tok = json.loads(path.read_text())
    renames = {THINK_ID: "<think>", END_THINK_ID: "</think>"}
    vocab = tok["model"]["vocab"]
    for entry in tok["added_tokens"]:
        if entry["id"] in renames:
            vocab.pop(entry["content"], None)
            entry["content"], entry["special"] = renames[entry["id"]], False
            vocab[entry["content"]] = entry["id"]
    path.write_text(json.dumps(tok))
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for tid, entry in (cfg.get("added_tokens_decoder") or {}).items():
        if int(tid) in renames:
            entry["content"], entry["special"] = renames[int(tid)], False
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    (folder / "chat_template.jinja").write_text(template)
    return folder
