"""The one error type of checkpoint resolution and loading."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be found, fetched, read or converted.

    The message always names the model id, directory or file at fault.
    """
