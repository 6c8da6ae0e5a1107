"""One Lua call writes every result event of a publisher batch: XADD, PUBLISH, EXPIRE.

Why a script: as separate pipelined commands, a batch of 256 token events (one engine step at full
batch) costs the worker ~770 commands to pack and ~770 replies to parse in Python, GIL time the
engine loop then waits for (decision 0024). As one EVAL the client packs one command (in C
with hiredis) and parses one array reply; Redis does the same work as before.

Semantics kept from the command-per-event form: each event is XADDed with its explicit id
"0-{seq}" (a duplicate id comes back as that event's status, so the caller can tell a retry from
a takeover); its pub/sub copy is PUBLISHed only when the XADD wrote it (a retried write is not
announced twice); EXPIRE is sent where the caller asks for it. The script runs inside the
publisher's MULTI/EXEC beside the acknowledgements, so it is EVAL (the body travels each time,
~1 KB) rather than EVALSHA: after a Redis restart there is no NOSCRIPT failure that would let the
XACKs in the same transaction run without the events before them. The `#!lua` shebang (Redis 7)
makes the script a write that Redis refuses when out of memory, before the MULTI runs: the whole
transaction is then refused and retried, as it was when the events were plain XADDs.
"""

from __future__ import annotations

from typing import Any

# KEYS[i]: result stream of event i. ARGV[1]: TTL seconds. Then per event:
#   id, channel, payload, expire ("1" / "0"), number of field pairs, field, value, ...
# Returns one status per event: 1 (written), or the error text of its XADD.
WRITE_EVENTS_SCRIPT = """#!lua
local ttl = ARGV[1]
local pos = 2
local status = {}
for i = 1, #KEYS do
  local id, channel, payload, expire = ARGV[pos], ARGV[pos + 1], ARGV[pos + 2], ARGV[pos + 3]
  local n = tonumber(ARGV[pos + 4])
  local fields = {}
  for j = 1, 2 * n do fields[j] = ARGV[pos + 4 + j] end
  pos = pos + 5 + 2 * n
  local written = redis.pcall('XADD', KEYS[i], id, unpack(fields))
  if type(written) == 'table' and written.err then
    status[i] = written.err
  else
    local published = redis.pcall('PUBLISH', channel, payload)
    status[i] = (type(published) == 'table' and published.err) or 1
  end
  if expire == '1' then redis.pcall('EXPIRE', KEYS[i], ttl) end
end
return status
"""


def write_events_args(ttl_s: int, writes: list[tuple[str, str, str, str, bool, dict[str, str]]]) -> list[Any]:
    """EVAL arguments for (stream, id, channel, payload, expire, fields) per event, in order:
    [script, numkeys, *streams, ttl, *per-event args]."""
    streams = [w[0] for w in writes]
    args: list[Any] = [WRITE_EVENTS_SCRIPT, len(streams), *streams, ttl_s]
    for _, event_id, channel, payload, expire, fields in writes:
        args += (event_id, channel, payload, "1" if expire else "0", len(fields))
        for item in fields.items():
            args += item
    return args
