"""Headless Chromium (Debian's `chromium`) driven over the DevTools protocol, for the web page test.

Only what the test needs: open a page, evaluate JavaScript, type, press keys, take a screenshot.
The browser gets a fresh profile and every flag that keeps it off the network except for the
page under test; it is stopped by its process group id (its renderers are its children).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--disable-default-apps", "--no-default-browser-check", "--mute-audio",
    "--disable-dev-shm-usage", "--window-size=1100,760", "--remote-debugging-port=0",
]  # fmt: skip


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise RuntimeError("no Chromium here: install Debian's `chromium` (apt-get install -y chromium)")


class Page:
    """One tab, over its DevTools websocket."""

    def __init__(self, ws_url: str) -> None:
        # NOTE: no Origin header, so Chromium accepts the connection without --remote-allow-origins.
        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self._ids = itertools.count(1)

    def send(self, method: str, **params: Any) -> dict:
        message_id = next(self._ids)
        self.ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float, poll_s: float = 0.05) -> Any:
        """Evaluate until the value is truthy; returns it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(poll_s)
        raise TimeoutError(f"not true within {timeout_s:g}s: {expression}")

    def type_text(self, text: str) -> None:
        self.send("Input.insertText", text=text)

    def press_enter(self) -> None:
        key = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13}
        self.send("Input.dispatchKeyEvent", type="keyDown", text="\r", **key)
        self.send("Input.dispatchKeyEvent", type="keyUp", **key)

    def screenshot(self, path: Path) -> bytes:
        png = base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        return png

    def close(self) -> None:
        self.ws.close()


class HeadlessChromium:
    def __init__(self, profile_dir: Path) -> None:
        self.profile_dir = profile_dir
        self.log = open(profile_dir.parent / "chromium.log", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [find_chromium(), *FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.port = self._devtools_port()

    def _devtools_port(self, timeout_s: float = 30.0) -> int:
        """Chromium writes the port it picked (--remote-debugging-port=0) into its profile."""
        marker = self.profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.process.returncode}")
            if marker.is_file() and (lines := marker.read_text().splitlines()):
                return int(lines[0])
            time.sleep(0.05)
        raise TimeoutError("chromium did not open its DevTools port")

    def open(self, url: str) -> Page:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/json/new?{url}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as response:
            target = json.load(response)
        page = Page(target["webSocketDebuggerUrl"])
        page.send("Page.enable")
        page.send("Runtime.enable")
        return page

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()
