"""An MoE checkpoint through the whole stack, unchanged: the official `openai` SDK -> a `python -m api`
process -> Redis -> a `python -m worker --model <tiny Qwen3-MoE dir>` process on CPU, against
transformers' own greedy tokens for the same prompts."""

from __future__ import annotations

import secrets

import openai
import pytest
import torch

from tests.api.processes import SERVED, ApiProcess, WorkerProcess
from tests.api.servers import API_KEY
from tests.engine.engine_helpers import hf_greedy

NUM_TOKENS = 12
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def moe_stack(redis_server, tiny_checkpoint, tmp_path_factory):
    model_dir = tiny_checkpoint("qwen3_moe")
    prefix = f"moe{secrets.token_hex(4)}"
    logs = tmp_path_factory.mktemp("moe-logs")
    client = redis_server.client(decode_responses=True)
    worker = WorkerProcess(redis_server, prefix, logs / "worker.log", model=str(model_dir))
    api = ApiProcess(redis_server, prefix, logs / "api.log")
    try:
        worker.wait_ready(client, prefix)
        api.wait_ready()
        yield {"url": api.url, "model_dir": model_dir}
    finally:
        api.stop()
        worker.stop()
        client.close()


def transformers_text(model_dir, prompt_ids: list[int]) -> str:
    from transformers import AutoTokenizer

    from tests.engine.checkpoints import load_hf_reference

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokens = hf_greedy(load_hf_reference(model_dir), prompt_ids, NUM_TOKENS)
    finally:
        torch.set_num_threads(threads)
    return AutoTokenizer.from_pretrained(model_dir).decode(tokens, skip_special_tokens=True)


def test_moe_checkpoint_serves_transformers_tokens_whole_and_streamed(moe_stack):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(moe_stack["model_dir"])
    client = openai.OpenAI(base_url=f"{moe_stack['url']}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    # NOTE: EOS is ignored so that both sides produce NUM_TOKENS tokens of the random model
    extra = {"ignore_eos": True}

    chat_ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)
    want_chat = transformers_text(moe_stack["model_dir"], list(chat_ids))
    whole = client.chat.completions.create(
        model=SERVED, messages=CHAT, max_tokens=NUM_TOKENS, temperature=0, extra_body=extra
    )
    assert whole.choices[0].message.content == want_chat
    assert whole.usage.completion_tokens == NUM_TOKENS
    assert whole.usage.prompt_tokens == len(chat_ids)

    want_completion = transformers_text(moe_stack["model_dir"], tokenizer(PROMPT)["input_ids"])
    streamed = client.completions.create(
        model=SERVED, prompt=PROMPT, max_tokens=NUM_TOKENS, temperature=0, stream=True, extra_body=extra,
        stream_options={"include_usage": True},
    )  # fmt: skip
    parts = list(streamed)
    assert "".join(p.choices[0].text for p in parts if p.choices) == want_completion
    assert parts[-1].usage.completion_tokens == NUM_TOKENS
