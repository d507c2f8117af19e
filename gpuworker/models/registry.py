"""Which Hugging Face architectures the one Llama-family model class can run."""
from __future__ import annotations

# HF architecture name -> short family name. SmolLM and Llama 2/3.x are LlamaForCausalLM.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


def check_supported(architectures: list[str], model_type: str | None = None) -> str:
    """Return the first supported architecture or raise a ValueError naming them all."""
    for arch in architectures:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    shown = ", ".join(architectures) or f"model_type={model_type!r}"
    raise ValueError(
        f"unsupported model architecture {shown}; inferq supports: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )
