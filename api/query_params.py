"""Query parameters a route does not declare are refused (400 naming the first), as the published schema says:
a misspelt `limit` or `after` must not silently list something else."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Request

from api.errors import bad_request


def only_query_params(*names: str) -> Callable[[Request], None]:
    """A route dependency: 400 for a query parameter other than `names`."""
    allowed = set(names)

    def check(request: Request) -> None:
        for name in request.query_params:
            if name not in allowed:
                raise bad_request(
                    f"unknown query parameter {name!r}; this route takes {sorted(allowed)}", param=name,
                    code="unknown_parameter",
                )  # fmt: skip

    return check
