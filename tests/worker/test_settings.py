"""Worker settings: flags over INFERQ_* environment over defaults, validated at the edge."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from worker.settings import WorkerSettings


def test_defaults(monkeypatch):
    for name in list(__import__("os").environ):
        if name.startswith("INFERQ_"):
            monkeypatch.delenv(name)
    settings = WorkerSettings.from_cli([])
    assert settings.redis_url == "redis://localhost:6379/0"
    assert settings.prefix == "inferq"
    assert settings.batch_window_ms == 5.0
    assert settings.lease_ms == 30_000 and settings.max_deliveries == 5
    assert settings.model_name == "default"


def test_flags_win_over_environment(monkeypatch):
    monkeypatch.setenv("INFERQ_REDIS_URL", "redis://env:6379/0")
    monkeypatch.setenv("INFERQ_BATCH_WINDOW_MS", "0")
    monkeypatch.setenv("INFERQ_MAX_NUM_SEQS", "8")
    settings = WorkerSettings.from_cli(
        [
            "--redis-url",
            "redis://flag:6379/1",
            "--model",
            "/m",
            "--served-model-name",
            "tiny",
            "--no-enable-prefix-caching",
        ]
    )
    assert settings.redis_url == "redis://flag:6379/1"
    assert settings.batch_window_ms == 0.0  # 0 is allowed: no window
    assert settings.max_num_seqs == 8
    assert settings.model_name == "tiny"
    config = settings.engine_config()
    assert config.model.model == "/m" and config.cache.enable_prefix_caching is False
    assert config.scheduler.max_num_seqs == 8 and config.scheduler.policy == "priority"


def test_pdl_is_left_to_the_kernels_unless_set(monkeypatch):
    """INFERQ_PDL reaches the engine config (LLMEngine then forces kernels/_pdl.py's switch); unset it
    stays None, which leaves the kernels' own default (on where the GPU has it)."""
    monkeypatch.delenv("INFERQ_PDL", raising=False)
    assert WorkerSettings.from_cli([]).engine_config().pdl is None
    monkeypatch.setenv("INFERQ_PDL", "false")
    assert WorkerSettings.from_cli([]).engine_config().pdl is False
    assert WorkerSettings.from_cli(["--pdl", "true"]).engine_config().pdl is True  # flags win


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--batch-window-ms", "-1"], "batch_window_ms"),
        (["--block-size", "12"], "block_size"),
        (["--lease-ms", "10"], "lease_ms"),
        (["--dtype", "float64"], "dtype"),
        (["--heartbeat-ttl-s", "1", "--heartbeat-interval-s", "2"], "heartbeat_ttl_s"),
    ],
)
def test_bad_values_name_the_setting(flags, field):
    with pytest.raises((ValidationError, SystemExit)) as info:
        WorkerSettings.from_cli(flags)
    assert field in str(info.value)


def test_cli_help_lists_settings_without_loading_the_engine():
    out = subprocess.run([sys.executable, "-m", "worker", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--redis-url" in out.stdout and "--batch-window-ms" in out.stdout and "--lease-ms" in out.stdout
