"""A quantized checkpoint through the whole stack: the official `openai` SDK -> a `python -m api` process ->
Redis -> a `python -m worker --model <tiny AWQ checkpoint>` process on CPU (the quantization_config picks
the format; no setting), against transformers' greedy tokens on the same weights dequantized."""

from __future__ import annotations

import secrets

import openai
import pytest
import torch

from tests.api.processes import SERVED, ApiProcess, WorkerProcess
from tests.api.servers import API_KEY
from tests.engine.engine_helpers import hf_greedy
from tests.engine.quant_checkpoints import build_quantized_checkpoint, dequantized_reference

NUM_TOKENS = 10
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def awq_stack(redis_server, smollm2_dir, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("awq")
    state = build_quantized_checkpoint("awq", model_dir, smollm2_dir)
    prefix = f"quant{secrets.token_hex(4)}"
    logs = tmp_path_factory.mktemp("quant-logs")
    client = redis_server.client(decode_responses=True)
    worker = WorkerProcess(redis_server, prefix, logs / "worker.log", model=str(model_dir))
    api = ApiProcess(redis_server, prefix, logs / "api.log")
    try:
        worker.wait_ready(client, prefix)
        api.wait_ready()
        yield {"url": api.url, "model_dir": model_dir, "state": state}
    finally:
        api.stop()
        worker.stop()
        client.close()


def test_awq_checkpoint_serves_the_dequantized_models_tokens(awq_stack):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(awq_stack["model_dir"])
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want = tokenizer.decode(hf_greedy(dequantized_reference(awq_stack["state"]), prompt_ids, NUM_TOKENS))
    finally:
        torch.set_num_threads(threads)
    client = openai.OpenAI(base_url=f"{awq_stack['url']}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    got = client.completions.create(
        model=SERVED, prompt=PROMPT, max_tokens=NUM_TOKENS, temperature=0, extra_body={"ignore_eos": True}
    )
    assert got.choices[0].text == want
    assert got.usage.completion_tokens == NUM_TOKENS
