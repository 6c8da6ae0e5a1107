"""The repository reads as a product: no file names a work session by number, and product code (api/, worker/,
engine/, kernels/) points at no benchmark result path; the figures behind a choice live in docs/decisions/.

Every file git tracks counts, and so does every new file git does not ignore, so the check fails before a
match is committed. The patterns are built from pieces, so this file does not match them itself.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK_SESSION = re.compile("sess" + r"ion [0-9]", re.IGNORECASE)
RESULTS_PATH = "bench/" + "results"
PRODUCT_CODE = ("api/", "worker/", "engine/", "kernels/")


def repository_files(root: Path) -> list[str]:
    """The paths git tracks, and the untracked ones it does not ignore, relative to root."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout  # fmt: skip
    return sorted({path for path in listed.decode().split("\0") if path})


def findings(root: Path) -> list[str]:
    """`path:line: what` for every line that names a work session, or a result path inside product code."""
    found = []
    for path in repository_files(root):
        file = root / path
        if not file.is_file():  # deleted in the work tree, not yet in the index
            continue
        data = file.read_bytes()
        if b"\0" in data[:8192]:  # binary (images, the packaged model's weights)
            continue
        in_product = path.startswith(PRODUCT_CODE)
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if WORK_SESSION.search(line):
                found.append(f"{path}:{number}: a work session by number: {line.strip()[:100]}")
            if in_product and RESULTS_PATH in line:
                found.append(f"{path}:{number}: a result path in product code (name the decision record instead)")
    return found


def test_no_work_sessions_and_no_result_paths_in_product_code():
    assert findings(ROOT) == []


def test_the_check_finds_what_is_planted(tmp_path):
    """In a repository of its own: a tracked and an untracked match of each kind are found; a result path outside
    product code, a file git ignores and a binary file are not."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    files = {
        "engine/ops.py": "# measured in " + "Sess" + "ion 7\nx = 1\n",
        "kernels/gemv.py": '"""Tiles (' + RESULTS_PATH + '/h100/gemv.md)."""\n',
        "docs/benchmarks.md": "Current results: " + RESULTS_PATH + "/h100/\n",
        "README.md": "Fine text about sessions of SSE.\n",
        ".gitignore": "ignored.txt\n",
        "ignored.txt": "sess" + "ion 3\n",
        "picture.png": "\0sess" + "ion 4\n",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    subprocess.run(["git", "add", "engine", "docs", "README.md", ".gitignore", "picture.png"], cwd=tmp_path,
                   check=True)  # fmt: skip
    (tmp_path / "worker").mkdir()
    (tmp_path / "worker" / "new.py").write_text("# see " + RESULTS_PATH + "/x, " + "SESS" + "ION 12\n")  # untracked
    assert findings(tmp_path) == [
        "engine/ops.py:1: a work session by number: # measured in " + "Sess" + "ion 7",
        "kernels/gemv.py:1: a result path in product code (name the decision record instead)",
        "worker/new.py:1: a work session by number: # see " + RESULTS_PATH + "/x, " + "SESS" + "ION 12",
        "worker/new.py:1: a result path in product code (name the decision record instead)",
    ]
