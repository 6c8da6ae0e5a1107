"""The quantization setting reaches the engine's ModelConfig from the flag or INFERQ_QUANTIZATION, and a bad
value is refused naming it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from worker.settings import WorkerSettings


def test_quantization_from_the_environment_and_the_flag(monkeypatch):
    monkeypatch.delenv("INFERQ_QUANTIZATION", raising=False)
    assert WorkerSettings.from_cli([]).engine_config().model.quantization is None
    monkeypatch.setenv("INFERQ_QUANTIZATION", "int4")
    assert WorkerSettings.from_cli([]).engine_config().model.quantization == "int4"
    assert WorkerSettings.from_cli(["--quantization", "fp8"]).engine_config().model.quantization == "fp8"


def test_a_bad_quantization_names_the_setting():
    with pytest.raises((ValidationError, SystemExit)) as info:
        WorkerSettings.from_cli(["--quantization", "int3"])
    assert "quantization" in str(info.value)


def test_the_settings_offer_exactly_the_engines_schemes():
    from engine.config import QUANTIZATIONS as ENGINE_SCHEMES
    from worker.settings import QUANTIZATIONS

    assert QUANTIZATIONS == ENGINE_SCHEMES
