"""What kept the benchmark's private Redis busy: its slow log and latency monitor over one throughput run.

Why: the clock on the worker's step reads (H100, 2026-11-27, bench/step_reads_clock.py) found the loop's remaining waits
in a few stretches of 6-50 ms in which Redis answered nothing, outside any save or AOF rewrite in its log. Redis
records both kinds of cause itself once asked to: the slow log keeps every command that ran longer than a
threshold (an EVAL of a merged publisher batch, an XRANGE of a long stream), the latency monitor every internal
event that did (an AOF write or fsync, a fork, the expire cycle). The stack starts redis-server with the
thresholds below (`SERVER_ARGS`); the benchmark resets both before the run and reads them after.
"""

from __future__ import annotations

import re
from collections import Counter

SLOWLOG_US = 2000  # commands that ran 2 ms or longer
LATENCY_MS = 5  # internal events of 5 ms or longer (Redis's monitor counts whole milliseconds)
SERVER_ARGS = [
    "--slowlog-log-slower-than", str(SLOWLOG_US), "--slowlog-max-len", "1024",
    "--latency-monitor-threshold", str(LATENCY_MS),
]  # fmt: skip


_MORE_ARGS = re.compile(r"\.\.\. \((\d+) more arguments\)")


def reset(client) -> None:
    """Forget what happened before the run (the warm-up, the low-load TTFT requests)."""
    client.slowlog_reset()
    client.execute_command("LATENCY", "RESET")


def _entry(raw) -> dict:
    """One SLOWLOG GET entry: [id, unix s, µs, [command, args...], client addr, client name] (Redis >= 4)."""
    args = [a.decode(errors="replace") if isinstance(a, bytes) else str(a) for a in raw[3]]
    # Redis keeps the first 31 arguments and then "... (N more arguments)"
    kept = [a for a in args if not _MORE_ARGS.fullmatch(a)]
    more = sum(int(m.group(1)) for a in args if (m := _MORE_ARGS.fullmatch(a)))
    return {"at_unix_s": int(raw[1]), "ms": int(raw[2]) / 1000, "command": kept[0].upper() if kept else "?",
            "num_args": len(kept) - 1 + more}  # fmt: skip


def collect(client) -> dict:
    """The run's slow commands (count and longest by command, the ten longest) and the latency monitor's events
    ({event: [latest ms, max ms]}), with the thresholds as the server holds them (proof the settings took)."""
    entries = [_entry(raw) for raw in client.execute_command("SLOWLOG", "GET", "1024")]
    by_command: Counter[str] = Counter(e["command"] for e in entries)
    longest: dict[str, float] = {}
    for e in entries:
        longest[e["command"]] = max(longest.get(e["command"], 0.0), e["ms"])
    events = {}
    for raw in client.execute_command("LATENCY", "LATEST"):
        name = raw[0].decode() if isinstance(raw[0], bytes) else str(raw[0])
        events[name] = [int(raw[2]), int(raw[3])]
    config = client.config_get("slowlog-log-slower-than") | client.config_get("latency-monitor-threshold")
    return {
        "slowlog_us": int(config["slowlog-log-slower-than"]),
        "latency_monitor_ms": int(config["latency-monitor-threshold"]),
        "slow_commands": dict(by_command),
        "slowest_ms_by_command": longest,
        "slowest": sorted(entries, key=lambda e: e["ms"], reverse=True)[:10],
        "latency_events_ms": events,
    }


def stalls_line(stalls: dict | None) -> str:
    """The report's sentence (runs before 2026-11-27 13:00 have none)."""
    if not stalls:
        return ""
    commands = ", ".join(
        f"{name} x{count} (longest {stalls['slowest_ms_by_command'][name]:.1f} ms)"
        for name, count in sorted(stalls["slow_commands"].items(), key=lambda kv: -kv[1])
    )
    events = ", ".join(f"{name} (latest {v[0]} ms, max {v[1]} ms)" for name, v in stalls["latency_events_ms"].items())
    return (
        f"Redis over the throughput run: commands of {stalls['slowlog_us'] / 1000:g} ms or longer: "
        f"{commands or 'none'}; internal events of {stalls['latency_monitor_ms']} ms or longer: {events or 'none'}."
    )
