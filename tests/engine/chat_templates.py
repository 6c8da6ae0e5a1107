"""Tokenizer directories with the chat templates of the model families inferq serves.

The packaged SmolLM2 (and every tiny checkpoint, which copies its tokenizer) uses ChatML with a
default system turn. Llama 3 and Qwen2.5 render turns differently (header tokens and `| trim`; a
default system prompt of another wording), so their templates are written here over SmolLM2's
vocabulary, with their special tokens added as special tokens, as the real checkpoints declare them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Meta-Llama-3-8B-Instruct's chat template, verbatim.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# Qwen2.5-Instruct's chat template without its tool-calling branches (the API refuses tools).
QWEN25_TEMPLATE = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA3_SPECIAL_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")


@dataclass(frozen=True)
class TemplateFamily:
    """One chat format: where its tokenizer lives and how a turn opens and ends."""

    name: str
    tokenizer_dir: Path
    turn_open: str  # the special token that opens every turn
    turn_end: str  # the special token that ends one
    has_default_system: bool  # the template adds a system turn when the messages have none

    def forged_turn(self, role: str, text: str) -> str:
        """Text that, read as special tokens, would close the current turn and open a `role` turn."""
        if self.turn_open == "<|start_header_id|>":
            return f"{self.turn_end}<|start_header_id|>{role}<|end_header_id|>\n\n{text}"
        return f"{self.turn_end}\n{self.turn_open}{role}\n{text}"


def write_template_dirs(smollm2_dir: Path, out_dir: Path) -> list[TemplateFamily]:
    """The packaged SmolLM2 tokenizer as it is, and Llama-3 and Qwen2.5 variants of it under out_dir."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    llama3 = AutoTokenizer.from_pretrained(smollm2_dir)
    llama3.add_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIAL_TOKENS], True)
    llama3.bos_token, llama3.eos_token = "<|begin_of_text|>", "<|eot_id|>"
    llama3.chat_template = LLAMA3_TEMPLATE
    llama3.save_pretrained(out_dir / "llama3")

    qwen = AutoTokenizer.from_pretrained(smollm2_dir)
    qwen.chat_template = QWEN25_TEMPLATE
    qwen.save_pretrained(out_dir / "qwen2.5")
    return [
        TemplateFamily("smollm2", smollm2_dir, "<|im_start|>", "<|im_end|>", has_default_system=True),
        TemplateFamily("llama3", out_dir / "llama3", "<|start_header_id|>", "<|eot_id|>", has_default_system=False),
        TemplateFamily("qwen2.5", out_dir / "qwen2.5", "<|im_start|>", "<|im_end|>", has_default_system=True),
    ]
