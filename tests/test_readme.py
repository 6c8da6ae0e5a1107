"""The README stays true: every setting is documented, and the two commands it gives exist."""

from __future__ import annotations

import re
from pathlib import Path

from api.settings import ApiSettings
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _env_names(settings_class) -> set[str]:
    return {f"INFERQ_{name.upper()}" for name in settings_class.model_fields}


def test_every_worker_and_api_setting_is_documented():
    missing = sorted(n for n in _env_names(WorkerSettings) | _env_names(ApiSettings) if n not in README)
    assert not missing, f"settings missing from README.md: {missing}"


def test_readme_documents_no_setting_that_does_not_exist():
    documented = set(re.findall(r"`(INFERQ_[A-Z_]+)`", README))
    known = _env_names(WorkerSettings) | _env_names(ApiSettings) | {"INFERQ_REDIS_SERVER"}
    assert documented <= known, f"README.md documents unknown settings: {sorted(documented - known)}"


def test_the_two_commands_are_the_ones_ci_runs():
    assert "bash .ci/setup && .venv/bin/inferq up" in README
    assert "bash .ci/run" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash .ci/setup && bash .ci/test" in ci
