"""The Redis ACL of docker/redis: rendering it as the container does, reading its grants, and
finding every Redis command that the api/ and worker/ code sends (by reading the code).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.ship.stack import REPO_ROOT

REDIS_DIR = REPO_ROOT / "docker" / "redis"
TEMPLATE = REDIS_DIR / "users.acl.template"
RENDER = REDIS_DIR / "render-acl.sh"
REDIS_CONF = REDIS_DIR / "redis.conf"

PASSWORDS = {
    "INFERQ_REDIS_ADMIN_PASSWORD": "admin-test-secret",
    "INFERQ_REDIS_API_PASSWORD": "api-test-secret",
    "INFERQ_REDIS_WORKER_PASSWORD": "worker-test-secret",
    "INFERQ_REDIS_BATCH_PASSWORD": "batch-test-secret",
}


def render(output: Path, passwords: dict[str, str] = PASSWORDS) -> subprocess.CompletedProcess:
    """Run docker/redis/render-acl.sh exactly as start-redis.sh does (POSIX sh + awk)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("INFERQ_REDIS_")}
    env.update(passwords)
    return subprocess.run(["sh", str(RENDER), str(TEMPLATE), str(output)], env=env, capture_output=True, text=True)


def granted_commands(acl_text: str) -> dict[str, set[str]]:
    """user -> every command its rules allow (+name tokens, root rules and selectors together)."""
    grants: dict[str, set[str]] = {}
    for line in acl_text.splitlines():
        tokens = line.replace("(", " ").replace(")", " ").split()
        if len(tokens) >= 2 and tokens[0] == "user":
            grants[tokens[1]] = {token[1:].lower() for token in tokens[2:] if token.startswith("+")}
    return grants


# ---- what the code sends ---------------------------------------------------------------------------

# redis-py method -> the command(s) it sends (NOTE: incr and decr send INCRBY and DECRBY). A method
# missing here (and from NOT_COMMANDS) fails the test, so a new call cannot slip past the ACL review.
METHOD_COMMANDS: dict[str, set[str]] = {
    "xadd": {"xadd"}, "xreadgroup": {"xreadgroup"}, "xautoclaim": {"xautoclaim"}, "xclaim": {"xclaim"},
    "xack": {"xack"}, "xrange": {"xrange"}, "xpending": {"xpending"}, "xpending_range": {"xpending"},
    "xinfo_groups": {"xinfo|groups"}, "xgroup_create": {"xgroup|create"}, "xtrim": {"xtrim"}, "xlen": {"xlen"},
    "publish": {"publish"}, "subscribe": {"subscribe"}, "unsubscribe": {"unsubscribe"},
    "get": {"get"}, "set": {"set"}, "mget": {"mget"}, "delete": {"del"}, "expire": {"expire"},
    "incr": {"incrby"}, "incrby": {"incrby"}, "decr": {"decrby"}, "decrby": {"decrby"}, "exists": {"exists"},
    "hset": {"hset"}, "hget": {"hget"}, "hgetall": {"hgetall"}, "hdel": {"hdel"}, "hvals": {"hvals"},
    "zadd": {"zadd"}, "zrem": {"zrem"}, "zcard": {"zcard"}, "zcount": {"zcount"},
    "hsetnx": {"hsetnx"}, "hkeys": {"hkeys"}, "xread": {"xread"},
    "zrange": {"zrange"}, "zrevrange": {"zrevrange"}, "zrank": {"zrank"}, "zrevrank": {"zrevrank"},
    "scan": {"scan"}, "scan_iter": {"scan"}, "ping": {"ping"},
    # Script objects run EVALSHA, and SCRIPT LOAD when the server does not know the script yet.
    "register_script": {"evalsha", "script|load"},
}  # fmt: skip
# Methods and submodules of redis-py that send no command of their own.
NOT_COMMANDS = {"pipeline", "execute", "pubsub", "get_message", "close", "aclose", "from_url", "call", "pcall"}
NOT_COMMANDS |= {"execute_command"}  # its command is its first argument: _RAW_COMMAND reads it
NOT_COMMANDS |= {"asyncio", "exceptions", "backoff", "retry"}
NOT_COMMANDS |= {"connection_pool"}  # an attribute: worker/deferred_replies.py makes its connection from it
# NOTE: redis-py health checks (health_check_interval) send PING on idle connections in both
# services, whether or not the code calls ping() itself.
IMPLICIT = {"ping"}

# Calls, and method references passed along (`self._with_group(self.client.xreadgroup, ...)`).
_CALL = re.compile(r"\b(?:client|redis|pipe|_pubsub|pubsub)\.([a-z_]+)\b")
_TRANSACTION = re.compile(r"\.pipeline\(\s*transaction\s*=\s*True")
_LUA_CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'")
_RAW_COMMAND = re.compile(r"\.execute_command\(\s*[\"']([A-Za-z]+)[\"']")
# Commands written as tuples for a connection's pack_commands (the worker's step reads:
# `[("GET", key)]`, `.append(("MGET", ...))`, `return ("XREADGROUP", ...)`).
_PACKED_COMMAND = re.compile(r"(?:\[|\(|return )\(\s*\"([A-Z]+)\",")


# The commands kombu's Redis transport sends for Celery (batch/celery_app.py; read from its code and seen with
# MONITOR): publishing a task (the API), and consuming one with late acknowledgement (the batch workers:
# BRPOP, the unacknowledged hash and index, the restore lock, a redis-py Lock released by script).
KOMBU_PUBLISH = {"lpush", "llen", "sadd", "multi", "exec"}
KOMBU_CONSUME = KOMBU_PUBLISH | {"brpop", "hset", "hget", "hdel", "zadd", "zrange", "zrem", "set", "get", "del"}
KOMBU_CONSUME |= {"evalsha", "script|load"}
# The files of batch/ that the API runs too (its routes share the stores).
BATCH_STORES = ("batch/file_store.py", "batch/batch_store.py")


def commands_used(package: str, extra_files: tuple[str, ...] = ()) -> tuple[set[str], dict[str, list[str]]]:
    """(commands, unknown method -> files) of every .py file under `package` (api, worker or batch) and of
    `extra_files` (paths from the repository's root)."""
    used = set(IMPLICIT)
    unknown: dict[str, list[str]] = {}
    paths = sorted((REPO_ROOT / package).rglob("*.py")) + [REPO_ROOT / name for name in extra_files]
    for path in paths:
        source = path.read_text()
        for method in _CALL.findall(source):
            if method in METHOD_COMMANDS:
                used |= METHOD_COMMANDS[method]
            elif method not in NOT_COMMANDS:
                unknown.setdefault(method, []).append(str(path.relative_to(REPO_ROOT)))
        if _TRANSACTION.search(source):
            used |= {"multi", "exec"}
        used |= {name.lower() for name in _LUA_CALL.findall(source)}
        used |= {name.lower() for name in _RAW_COMMAND.findall(source)}
        used |= {name.lower() for name in _PACKED_COMMAND.findall(source)}
    return used, unknown
