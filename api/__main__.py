"""`python -m api`: serve the API with uvicorn, settings from the environment (INFERQ_*)."""

from __future__ import annotations

import logging

import uvicorn

from api.main import create_app
from api.settings import ApiSettings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ApiSettings()
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        loop=settings.event_loop,
        http=settings.http_parser,
        # Above our own header limit, so that our 431 (OpenAI's envelope) answers first.
        h11_max_incomplete_event_size=64 * 1024,
        proxy_headers=True,
        log_level="info",
        timeout_graceful_shutdown=10,
    )


if __name__ == "__main__":
    main()
