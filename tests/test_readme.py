"""The README and docs/ stay true: every setting is documented, the two commands exist, links lead somewhere.

Convention for the README's runnable examples (a test extracts and runs them against `inferq up`): each one is
a fenced block, ```bash for curl and shell, ```python for Python, directly under a line
`<!-- example: NAME -->` (NAME: lower-case words joined by hyphens, unique in the README, e.g. chat-curl,
chat-openai, stream-openai, redis-submit). They call the API at http://127.0.0.1:8000 without an API key;
redis-submit reads INFERQ_REDIS_URL (default redis://127.0.0.1:6379/0) for the service's Redis, and
offline-llm runs the engine in-process. A block without the marker line is illustration, not run.
"""

from __future__ import annotations

import re
from pathlib import Path

from api.settings import ApiSettings
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# The settings tables: every INFERQ_* setting of the worker and the API, with its default.
SETTINGS_DOC = ROOT / "docs" / "settings.md"
SETTINGS = SETTINGS_DOC.read_text()
DOCS = sorted((ROOT / "docs").rglob("*.md"))
MAX_README_LINES = 300

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_EXAMPLE_MARKER = re.compile(r"^<!-- example: (.*) -->$", re.M)
_EXAMPLE_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def _env_names(settings_class) -> set[str]:
    return {f"INFERQ_{name.upper()}" for name in settings_class.model_fields}


def _names_read_outside_settings() -> set[str]:
    """INFERQ_* variables the repository reads other than as settings: the Compose files and Redis's start
    script (passwords, ports, the models folder), the code's own (`inferq up`'s redis-server), the load tests'."""
    files = [*ROOT.glob("docker-compose*.yml"), *(ROOT / "docker").rglob("*.sh")]
    for package in ("api", "worker", "engine", "kernels", "loadtests"):
        files += (ROOT / package).rglob("*.py")
    return {name for path in files for name in re.findall(r"INFERQ_[A-Z_]+", path.read_text())}


def test_every_worker_and_api_setting_is_documented():
    missing = sorted(n for n in _env_names(WorkerSettings) | _env_names(ApiSettings) if f"`{n}`" not in SETTINGS)
    assert not missing, f"settings missing from {SETTINGS_DOC.relative_to(ROOT)}: {missing}"


def test_readme_and_docs_document_no_setting_that_does_not_exist():
    known = _env_names(WorkerSettings) | _env_names(ApiSettings) | _names_read_outside_settings()
    for path in [ROOT / "README.md", *DOCS]:
        documented = set(re.findall(r"`(INFERQ_[A-Z_]+)", path.read_text()))
        unknown = sorted(documented - known)
        assert not unknown, f"{path.relative_to(ROOT)} documents unknown settings: {unknown}"


def test_readme_links_the_settings_page():
    assert "(docs/settings.md)" in README


def test_the_two_commands_are_the_ones_ci_runs():
    assert "bash .ci/setup && .venv/bin/inferq up" in README
    assert "bash .ci/run" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash .ci/setup && bash .ci/test" in ci


def test_readme_is_a_guide_of_at_most_300_lines():
    num_lines = len(README.splitlines())
    assert num_lines <= MAX_README_LINES, f"README.md has {num_lines} lines, more than {MAX_README_LINES}"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(markdown: str) -> set[str]:
    without_code = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    return {_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", without_code, re.M)}


def _relative_links(markdown: str) -> list[str]:
    without_code = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    return [t for t in _LINK.findall(without_code) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def test_every_relative_link_in_readme_and_docs_leads_to_a_file_that_exists():
    broken = []
    for path in [ROOT / "README.md", *DOCS]:
        for target in _relative_links(path.read_text()):
            file_part, _, fragment = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}: {target}"
            if not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif fragment and resolved.suffix == ".md" and fragment not in _anchors(resolved.read_text()):
                broken.append(f"{where} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_link_check_sees_links_and_headings():
    # The check above must not pass for want of finding anything.
    assert "docs/settings.md#inferq-up" in _relative_links(README)
    assert "inferq-up" in _anchors(SETTINGS)
    assert _anchor("From another service, through Redis") == "from-another-service-through-redis"
    assert all(not t.startswith("http") for t in _relative_links("[a](https://example.com) [b](x.md)"))


def test_every_readme_example_marker_sits_on_one_fenced_block():
    lines = README.splitlines()
    names = []
    for number, line in enumerate(lines):
        marker = _EXAMPLE_MARKER.match(line)
        if marker is None:
            continue
        name = marker.group(1)
        names.append(name)
        assert _EXAMPLE_NAME.match(name), f"README.md line {number + 1}: example name {name!r}"
        fence = lines[number + 1] if number + 1 < len(lines) else ""
        assert fence in ("```bash", "```python"), f"README.md line {number + 1}: {name} is not over a bash/python block"
    assert len(names) == len(set(names)), f"example names repeat: {names}"
    assert {"chat-curl", "chat-openai", "stream-openai", "redis-submit"} <= set(names)
