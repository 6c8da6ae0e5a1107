"""bench/redis_stalls.py against the suite's private Redis: the slow log's entries are read back with their
command and argument count (Redis truncates long argument lists), and the report line names them."""

from __future__ import annotations

from bench import redis_stalls


def test_slow_commands_are_counted_by_name_with_their_arguments(redis_server) -> None:
    client = redis_server.client()
    saved = client.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    client.config_set("slowlog-log-slower-than", 0)  # record every command, so this test has some
    try:
        redis_stalls.reset(client)
        client.eval("return #ARGV", 0, *range(40))  # 43 arguments after EVAL: Redis keeps 31, then a count
        client.get("stalls-test")
        stalls = redis_stalls.collect(client)
    finally:
        client.config_set("slowlog-log-slower-than", saved)
    assert stalls["slowlog_us"] == 0
    assert stalls["slow_commands"]["EVAL"] == 1 and stalls["slow_commands"]["GET"] >= 1
    (evaluation,) = [e for e in stalls["slowest"] if e["command"] == "EVAL"]
    assert evaluation["num_args"] == 42 and evaluation["ms"] >= 0
    line = redis_stalls.stalls_line(stalls)
    assert "EVAL x1" in line and "commands of 0 ms or longer" in line
