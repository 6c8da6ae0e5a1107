"""`python -m api`: serve the API with uvicorn, settings from the environment (INFERQ_*)."""

from __future__ import annotations

import logging
import sys

import uvicorn

from api.http_server import server_config
from api.main import create_app
from api.settings import ApiSettings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ApiSettings()
    server = uvicorn.Server(server_config(create_app(settings), settings))
    server.run()
    if not server.started:
        sys.exit(3)  # as `uvicorn.run` does: the app or the socket failed at start


if __name__ == "__main__":
    main()
