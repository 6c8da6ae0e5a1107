"""Redis reads that ride a step: sent while the GPU runs it, their replies read after its outputs.

Why: at full batch the worker loop is host-bound (decision 0033): the GPU waits for the loop between
steps, so every millisecond the loop spends waiting on a socket is a millisecond of GPU idle. The
step's reads (the cancel counter, new messages) as waited round trips cost a large share of a step
(decision 0025). Written on the loop's own
connection at once and read back only after the step's outputs are turned into events, their
round trip runs while the loop does that work, and the replies are waiting in the socket buffer.

The connection is the loop's alone (the lease and heartbeat threads use the pool's), so nothing
else can read its replies. A connection error drops it; the next send reconnects.
"""

from __future__ import annotations

import redis

from worker.redis_client import CONNECTION_ERRORS


class DeferredReplies:
    """Args:
    client: the worker's client; the connection is made with its pool's settings.
    """

    def __init__(self, client: redis.Redis) -> None:
        pool = client.connection_pool
        self._connection = pool.connection_class(**pool.connection_kwargs)
        self._num_pending = 0

    @property
    def pending(self) -> bool:
        """Commands were sent whose replies are not read yet."""
        return self._num_pending > 0

    def send(self, commands: list[tuple]) -> None:
        """Write the commands in one go, without waiting. Raises CONNECTION_ERRORS."""
        if self._num_pending:
            raise RuntimeError("the replies of the last send were not read")
        if not commands:
            return
        try:
            self._connection.send_packed_command(self._connection.pack_commands(commands))
        except CONNECTION_ERRORS:
            self._connection.disconnect()
            raise
        self._num_pending = len(commands)

    def receive(self) -> list:
        """The replies of the last send, in order; a command Redis refused gives its ResponseError
        in its place. Raises CONNECTION_ERRORS (the connection is dropped)."""
        expected, self._num_pending = self._num_pending, 0
        replies: list = []
        try:
            while len(replies) < expected:
                try:
                    replies.append(self._connection.read_response())
                except redis.ResponseError as exc:
                    replies.append(exc)
        except BaseException:  # replies left unread would answer the next send: start afresh
            self._connection.disconnect()
            raise
        return replies

    def close(self) -> None:
        self._num_pending = 0
        self._connection.disconnect()
