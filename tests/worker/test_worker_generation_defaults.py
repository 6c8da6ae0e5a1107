"""A Redis submitter that leaves sampling fields out gets the model's generation defaults from the
worker (as API requests do), and `--generation-defaults none` gives SamplingParams' own."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from tests.worker.harness import ThreadWorker, make_settings, offline_outputs, submit, tokens_by_index, wait_complete
from worker.protocol import Keys, ModelInfo

pytestmark = pytest.mark.timeout(180)

# A model whose authors recommend this sampling; max_new_tokens is the default max_tokens.
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 7}
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def model_with_defaults(worker_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("tiny-with-generation-defaults")
    for path in worker_model_dir.iterdir():
        shutil.copy(path, target / path.name)
    config = json.loads((target / "generation_config.json").read_text())
    (target / "generation_config.json").write_text(json.dumps({**config, **SAMPLING}))
    return target


def run_jobs(redis_server, prefix: str, model_dir: Path, jobs: dict[str, dict], **settings):
    """Submit `jobs` (id -> params) to a worker in a thread; returns its engine, tokens and ModelInfo."""
    keys, client = Keys(prefix), redis_server.client()
    with ThreadWorker(make_settings(redis_server, prefix, model_dir, **settings)) as running:
        for request_id, params in jobs.items():
            submit(client, keys, request_id, prompt=PROMPT, params=params)
        results = wait_complete(client, keys, list(jobs))
        engine = running.worker.engine
    info = ModelInfo.from_json(client.get(keys.model))
    return engine, {rid: tokens_by_index(events)[0] for rid, events in results.items()}, info


def test_silent_fields_take_the_models_defaults(redis_server, prefix, model_with_defaults, caplog) -> None:
    jobs = {"silent": {"seed": 11}, "explicit": {"seed": 11, "temperature": 0, "max_tokens": 4}}
    with caplog.at_level(logging.INFO, logger="engine.llm_engine"):
        engine, tokens, info = run_jobs(redis_server, prefix, model_with_defaults, jobs)
    assert "temperature=0.7, top_p=0.9, top_k=20, max_tokens=7" in caplog.text  # said at start
    prompt_ids = engine.encode(PROMPT)
    expected = offline_outputs(
        engine,
        {
            "silent": (prompt_ids, {"seed": 11, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_tokens": 7}),
            "explicit": (prompt_ids, {"seed": 11, "temperature": 0, "top_p": 0.9, "top_k": 20, "max_tokens": 4}),
        },
    )
    assert tokens == {rid: out[0] for rid, out in expected.items()}
    assert len(tokens["silent"]) == 7 and len(tokens["explicit"]) == 4
    assert info.default_max_tokens == 7  # the API's chat default


def test_generation_defaults_none_keeps_sampling_params_defaults(redis_server, prefix, model_with_defaults) -> None:
    engine, tokens, info = run_jobs(
        redis_server, prefix, model_with_defaults, {"silent": {"seed": 11}}, generation_defaults="none"
    )
    expected = offline_outputs(engine, {"silent": (engine.encode(PROMPT), {"seed": 11})})  # temperature 1, 16 tokens
    assert tokens["silent"] == expected["silent"][0] and len(tokens["silent"]) == 16
    assert info.default_max_tokens is None
