"""The packaged Gemma 3 270M through the whole stack: the official `openai` SDK -> a `python -m api` process ->
Redis -> a `python -m worker --model gemma3-270m` process on CPU (its short name: the worker joins and converts
the packaged file itself), against transformers' greedy tokens on the same converted weights."""

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
# A first start joins the chunks and converts the model into ~/.cache/inferq/models (about a minute on 2 cores).
FIRST_START_S = 600


@pytest.fixture(scope="module")
def gemma_stack(redis_server, gemma3_270m_dir, tmp_path_factory):
    prefix = f"gemma{secrets.token_hex(4)}"
    logs = tmp_path_factory.mktemp("gemma-logs")
    client = redis_server.client(decode_responses=True)
    worker = WorkerProcess(redis_server, prefix, logs / "worker.log", model="gemma3-270m")
    api = ApiProcess(redis_server, prefix, logs / "api.log")
    try:
        worker.wait_ready(client, prefix, timeout_s=FIRST_START_S)
        api.wait_ready()
        yield {"url": api.url, "model_dir": gemma3_270m_dir}
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


def test_gemma3_270m_serves_transformers_tokens_whole_and_streamed(gemma_stack):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gemma_stack["model_dir"])
    client = openai.OpenAI(base_url=f"{gemma_stack['url']}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    extra = {"ignore_eos": True}  # both sides produce NUM_TOKENS tokens of the pretrained model

    chat_ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tokenizer.decode(chat_ids).startswith("<bos><start_of_turn>user\n")
    want_chat = transformers_text(gemma_stack["model_dir"], list(chat_ids))
    whole = client.chat.completions.create(
        model=SERVED, messages=CHAT, max_tokens=NUM_TOKENS, temperature=0, extra_body=extra
    )
    assert whole.choices[0].message.content == want_chat
    assert whole.usage.completion_tokens == NUM_TOKENS
    assert whole.usage.prompt_tokens == len(chat_ids)

    want_completion = transformers_text(gemma_stack["model_dir"], tokenizer(PROMPT)["input_ids"])
    streamed = client.completions.create(
        model=SERVED, prompt=PROMPT, max_tokens=NUM_TOKENS, temperature=0, stream=True, extra_body=extra,
        stream_options={"include_usage": True},
    )  # fmt: skip
    parts = list(streamed)
    assert "".join(p.choices[0].text for p in parts if p.choices) == want_completion
    assert parts[-1].usage.completion_tokens == NUM_TOKENS
