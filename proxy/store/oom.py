"""Writes the proxy must make while Redis is full (``maxmemory`` reached, policy ``noeviction``).

Redis refuses "deny-oom" commands (SET, INCR, HSET, ZADD, SADD, XADD, ...) once ``used_memory`` is
past ``maxmemory``; commands that free or keep memory (DEL, PEXPIRE, XTRIM, XDEL, ZREM...) still run.
A Lua script is refused only at its *first* write, when that write is deny-oom: once a script has
written, Redis cannot stop it half-way, so the rest of its writes run (Redis 6.2, and Redis 7 for
scripts without a shebang). The proxy's own bookkeeping (lease acquire/renew/release, offset commits,
membership heartbeats, the trimmer's lease, the expired counters) overwrites values of a few bytes in
place, so it may run under OOM: each of those scripts starts with :data:`OOM_PASS`, a DEL of a key
that never exists (in the slot of the script's first key), which is such a first write. What grows
memory without bound, the producer's XADD, starts with INCR and stays refused: producers get a
retriable error until trims and consumption make room (DESIGN.md, "Retention and memory").
"""

from __future__ import annotations

from typing import Final

#: Lua: a first write that Redis runs under OOM, so the script's own writes run too. The key shares
#: the hash tag of ``KEYS[1]`` (a suffix keeps the first ``{...}``), so a Cluster finds it in the slot.
OOM_PASS: Final = "redis.call('DEL', KEYS[1] .. ':oom-pass')\n"
