"""An API server in a thread of the test process (real uvicorn, real sockets, a free port)."""

from __future__ import annotations

import threading
import time

import httpx
import uvicorn

from api.http_server import server_config
from api.main import create_app
from api.settings import ApiSettings
from batch.settings import BatchSettings
from tests.redis_server import free_port

API_KEY = "sk-test-key-1"


class ThreadApi:
    """`create_app(settings)` served by uvicorn in a thread of the test process, on a free port."""

    def __init__(self, settings: ApiSettings, batch_settings: BatchSettings | None = None) -> None:
        self.settings = settings
        self.port = free_port()
        # The same server as `python -m api` (its connection guard included), on a free local port.
        config = server_config(
            create_app(settings, batch_settings), settings, host="127.0.0.1", port=self.port, log_level="warning",
            timeout_graceful_shutdown=1,
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"api-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ThreadApi:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def client(self, api_key: str | None = API_KEY, headers: dict | None = None, timeout: float = 10.0) -> httpx.Client:
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return httpx.Client(base_url=self.url, headers={**auth, **(headers or {})}, timeout=timeout)
