"""One Redis pub/sub connection per API process, shared by every stream it relays.

    hub = EventHub(redis, anchor_channel)
    subscription = await hub.subscribe(channel)  # returns once Redis has confirmed the SUBSCRIBE
    # or: hub.subscribe(channel, confirmed=False) returns once it is sent; `await subscription.confirmed()`
    data = await subscription.get(timeout=1.0)   # the next message's data, or None after the timeout
    await subscription.close()

Why: with a subscription of its own per stream, every request opened a new Redis connection
(redis-py closes a pub/sub's connection with it). On the submit path that was a connect, a
handshake and a SUBSCRIBE round trip, a measurable share of the response headers' latency (decision 0027).
Here a SUBSCRIBE is one command on a connection that is already open, and the submit path waits
only for Redis's confirmation of it (so the request is enqueued after Redis listens for it).

NOTE: correctness never rests on the hub. EventSource reads the result stream whenever a seq is
skipped and after every `poll_s` of silence, so a message lost to a reconnect costs latency only.
When the shared connection fails, every open subscription raises that error (the relay ends the
client's stream with a resumable error, as it did when each stream had its own connection), and
the next subscribe opens a new connection.
NOTE: the hub stays subscribed to `anchor_channel`, a channel no request uses, so its connection is
never in the "not subscribed" state: there redis-py's send path may run a health-check PING and read
its reply, which would race the reader task for the socket.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger("inferq.api")

# Redis confirms a SUBSCRIBE within a round trip; past this the connection is taken as broken.
CONFIRM_TIMEOUT_S = 5.0


class Subscription:
    """The messages of one channel for one reader, in the order Redis published them."""

    def __init__(self, hub: EventHub, channel: str, confirmation: asyncio.Future) -> None:
        self.hub = hub
        self.channel = channel
        self._confirmation = confirmation  # the channel's: done once Redis confirmed the SUBSCRIBE
        self._inbox: asyncio.Queue[str | BaseException] = asyncio.Queue()
        self.closed = False

    async def confirmed(self) -> None:
        """Returns once Redis has confirmed that the hub listens to the channel (at once if it has). On a
        timeout or a failure of the hub's connection the subscription is closed and the error raised."""
        future = self._confirmation
        if future.done() and not future.cancelled() and future.exception() is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._confirmation), CONFIRM_TIMEOUT_S)
        except TimeoutError:
            await self.close()
            raise RedisTimeoutError(
                f"Redis did not confirm the subscription to {self.channel} within {CONFIRM_TIMEOUT_S} s"
            ) from None
        except BaseException:
            await self.close()
            raise

    def _deliver(self, item: str | BaseException) -> None:
        self._inbox.put_nowait(item)

    async def get(self, timeout: float) -> str | None:
        """The next message's data; None when none came within `timeout` s; raises what broke the hub."""
        try:
            item = self._inbox.get_nowait()
        except asyncio.QueueEmpty:
            try:
                item = await asyncio.wait_for(self._inbox.get(), timeout)
            except TimeoutError:
                return None
        if isinstance(item, BaseException):
            raise item
        return item

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.hub._leave(self)


@dataclass
class _Channel:
    confirmed: asyncio.Future
    readers: set[Subscription] = field(default_factory=set)


class EventHub:
    def __init__(self, redis: Redis, anchor_channel: str) -> None:
        self.redis = redis
        self.anchor_channel = anchor_channel
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task | None = None
        self._channels: dict[str, _Channel] = {}
        # SUBSCRIBEs sent and not yet confirmed, per channel: a channel left and joined again before
        # the first confirmation came must wait for its own.
        self._unconfirmed: defaultdict[str, int] = defaultdict(int)
        # Sends happen in the order of the hub's bookkeeping (a leave's UNSUBSCRIBE before a new SUBSCRIBE).
        self._send_lock = asyncio.Lock()

    @property
    def channels(self) -> int:
        """Channels with at least one reader (for tests and metrics)."""
        return len(self._channels)

    async def subscribe(self, channel: str, *, confirmed: bool = True) -> Subscription:
        """A reader of `channel`, returned once Redis has confirmed that the hub listens to it; with
        confirmed=False once the SUBSCRIBE is sent (the caller awaits `Subscription.confirmed()` before it
        relies on the channel)."""
        async with self._send_lock:
            entry = self._channels.get(channel)
            first = entry is None  # the channel's first reader sends its SUBSCRIBE
            if first:
                entry = self._channels[channel] = _Channel(confirmed=asyncio.get_running_loop().create_future())
            subscription = Subscription(self, channel, entry.confirmed)
            entry.readers.add(subscription)
            if first:
                try:
                    pubsub = await self._connected()
                    self._unconfirmed[channel] += 1
                    await pubsub.subscribe(channel)
                except BaseException:
                    self._forget(entry, subscription)
                    raise
        if confirmed:
            await subscription.confirmed()
        return subscription

    async def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        await self._drop_connection()

    async def _connected(self) -> PubSub:
        if self._pubsub is None:
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(self.anchor_channel)
            except BaseException:
                await _close_quietly(pubsub)
                raise
            self._pubsub = pubsub
            self._reader = asyncio.get_running_loop().create_task(self._read(pubsub))
        return self._pubsub

    def _forget(self, entry: _Channel, subscription: Subscription) -> bool:
        """Remove one reader; True when it was the channel's last (the channel is then dropped)."""
        entry.readers.discard(subscription)
        if entry.readers or self._channels.get(subscription.channel) is not entry:
            return False
        del self._channels[subscription.channel]
        if not entry.confirmed.done():
            entry.confirmed.cancel()
        return True

    async def _leave(self, subscription: Subscription) -> None:
        async with self._send_lock:
            entry = self._channels.get(subscription.channel)
            if entry is None or subscription not in entry.readers or not self._forget(entry, subscription):
                return
            if self._pubsub is not None:
                try:
                    await self._pubsub.unsubscribe(subscription.channel)
                except RedisError as exc:  # the reader sees the broken connection too, and fails everyone
                    log.debug("unsubscribing from %s failed: %s", subscription.channel, exc)

    async def _read(self, pubsub: PubSub) -> None:
        try:
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is not None:
                    self._dispatch(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("the API's pub/sub connection failed: %s", exc)
            await self._fail(pubsub, exc)

    def _dispatch(self, message: dict) -> None:
        kind, channel = message.get("type"), message.get("channel")
        entry = self._channels.get(channel)
        if kind == "message":
            if entry is not None:
                for reader in entry.readers:
                    reader._deliver(message["data"])
        elif kind == "subscribe":
            left = max(0, self._unconfirmed[channel] - 1)
            if left:
                self._unconfirmed[channel] = left
            else:
                self._unconfirmed.pop(channel, None)
                if entry is not None and not entry.confirmed.done():
                    entry.confirmed.set_result(None)

    async def _fail(self, pubsub: PubSub, exc: Exception) -> None:
        """Every reader gets the error; the next subscribe opens a new connection."""
        async with self._send_lock:
            if self._pubsub is not pubsub:
                return
            channels, self._channels = self._channels, {}
            self._unconfirmed.clear()
            self._pubsub, self._reader = None, None
            for entry in channels.values():
                if not entry.confirmed.done():
                    entry.confirmed.set_exception(exc)
                    entry.confirmed.exception()  # retrieved: a channel nobody waits on must not log it
                for reader in entry.readers:
                    reader._deliver(exc)
        await _close_quietly(pubsub)

    async def _drop_connection(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            await _close_quietly(pubsub)


async def _close_quietly(pubsub: PubSub) -> None:
    try:
        await pubsub.aclose()
    except Exception:  # a broken connection is closed anyway
        log.debug("closing the API's pub/sub connection failed", exc_info=True)
