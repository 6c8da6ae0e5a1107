"""Model classes by the checkpoint's `architectures[0]`."""

from __future__ import annotations

from typing import Any

from torch import nn

from engine.models.gemma3 import Gemma3ForCausalLM, Gemma3ForConditionalGeneration
from engine.models.gpt2 import GPT2LMHeadModel
from engine.models.llama import LlamaForCausalLM, MistralForCausalLM
from engine.models.mixtral import MixtralForCausalLM
from engine.models.olmoe import OlmoeForCausalLM
from engine.models.qwen2 import Qwen2ForCausalLM
from engine.models.qwen2_moe import Qwen2MoeForCausalLM
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.models.qwen3_moe import Qwen3MoeForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "GPT2LMHeadModel": GPT2LMHeadModel,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "OlmoeForCausalLM": OlmoeForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Gemma3ForConditionalGeneration": Gemma3ForConditionalGeneration,
}
# Architectures refused with their reason (a user asking for them learns why, not only that).
REFUSED: dict[str, str] = {
    "Gemma2ForCausalLM": "Gemma 2 soft-caps its attention scores (attn_logit_softcapping), which inferq's attention "
    "kernels do not apply; Gemma 3 (Gemma3ForCausalLM) is supported",
}


def supported_architectures() -> list[str]:
    return sorted(MODEL_REGISTRY)


def resolve_model_class(hf_config: Any) -> type[nn.Module]:
    """The class for `hf_config.architectures[0]`.

    Raises:
        ValueError: config.json names no architecture, or one inferq does not implement.
    """
    architectures = getattr(hf_config, "architectures", None) or []
    if not architectures:
        raise ValueError(f"config.json has no 'architectures'; supported: {supported_architectures()}")
    name = architectures[0]
    if name in REFUSED:
        raise ValueError(f"architecture {name!r} is not supported: {REFUSED[name]}")
    if name not in MODEL_REGISTRY:
        raise ValueError(f"architecture {name!r} is not supported; supported: {supported_architectures()}")
    return MODEL_REGISTRY[name]
