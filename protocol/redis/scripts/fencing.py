"""The proxy's bookkeeping under fencing: leases, commits, heartbeats, the group registry, pull-lease
records and ``ddmq offsets reset`` (DESIGN.md, "Leases and fencing"). Each starts with
:data:`OOM_PASS_LUA` where it must run while Redis is full."""

from __future__ import annotations

from typing import Final

from ddmq.protocol.redis.scripts.streams import STREAM_INTACT_LUA

# With ``maxmemory`` reached (policy noeviction) Redis refuses "deny-oom" commands (SET, INCR, HSET,
# ZADD, SADD, XADD...) and runs the rest (GET, DEL, PEXPIRE, XTRIM, XDEL...). A script is refused only
# at its *first* write, when that write is deny-oom: once a script has written, Redis cannot stop it
# half-way, so the rest of its writes run (Redis 6.2, and Redis 7 for scripts without a shebang). The
# proxy's bookkeeping (leases, commits, heartbeats, the trimmer lease, expired counters) overwrites
# values of a few bytes in place, so it may run under OOM: each of those scripts starts with this DEL
# of a key that never exists, which is such a first write. The suffix keeps ``KEYS[1]``'s first
# ``{...}``, so the key is in the script's slot on a Cluster. The producer's scripts start with a
# deny-oom write and stay refused as a whole: producers get a retriable error until trims make room.
OOM_PASS_LUA: Final = "redis.call('DEL', KEYS[1] .. ':oom-pass')\n"


# KEYS: lease, term.  ARGV: owner, ttl_ms.  Returns the new term, or 0 when another owner holds it.
LEASE_ACQUIRE_LUA: Final = OOM_PASS_LUA + """
local current = redis.call('GET', KEYS[1])
if current then
  local owner = string.match(current, '^(.*) %d+$')
  if owner ~= ARGV[1] then return 0 end
end
local term = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. term, 'PX', ARGV[2])
return term
"""

# Shared check: does ARGV[1] (the token "<owner> <term>") still hold the lease?
_HOLDS: Final = """
local function holds()
  local current = redis.call('GET', KEYS[1])
  if current then return current == ARGV[1] end
  local term = string.match(ARGV[1], ' (%d+)$')
  return redis.call('GET', KEYS[2]) == term
end
"""

# KEYS: lease, term.  ARGV: token, ttl_ms.  1 = renewed, 0 = lost.
LEASE_RENEW_LUA: Final = OOM_PASS_LUA + _HOLDS + """
if not holds() then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# LEASE_RENEW_LUA for many leases in one call: the same check and write for each, so a lease whose
# term was taken over is reported lost while the others of the batch are renewed. A held lease costs
# one command, GETEX, which reads the holder and sets the expiry in one step (Redis 6.2+): renewals are
# most of an idle proxy's Redis work. When the holder is another proxy, GETEX has set that proxy's
# lease to our ttl_ms: the value, hence the owner and the fencing term, is untouched, and with the
# group's lease settings shared by its proxies the expiry moves by less than one renewal interval;
# this happens once, as the lease is reported lost here.
# KEYS: each lease's lease and term, in pairs.  ARGV: ttl_ms, then each lease's token, in the same order.
# Returns one flag per lease: 1 = renewed, 0 = lost. Its keys span slots on a single Redis only: on a
# Cluster the caller batches the leases of one slot (one queue's, whatever the group).
LEASE_RENEW_MANY_LUA: Final = OOM_PASS_LUA + """
local renewed = {}
for i = 1, #KEYS / 2 do
  local lease, token = KEYS[2 * i - 1], ARGV[i + 1]
  local current, ours = redis.call('GETEX', lease, 'PX', ARGV[1]), false
  if current then ours = current == token
  elseif redis.call('GET', KEYS[2 * i]) == string.match(token, ' (%d+)$') then
    redis.call('SET', lease, token, 'PX', ARGV[1])
    ours = true
  end
  renewed[i] = ours and 1 or 0
end
return renewed
"""

# KEYS: lease, term.  ARGV: token.  1 = released, 0 = it was not ours any more.
# The term moves on with the release: a released lease is given up for good, so a renewal or a commit
# of the old token that reaches Redis after it (one in flight as the lease was released) is refused
# instead of writing the lease back, which would hold the queue for a TTL with nobody reading it.
LEASE_RELEASE_LUA: Final = OOM_PASS_LUA + _HOLDS + """
if not holds() then return 0 end
redis.call('DEL', KEYS[1])
redis.call('INCR', KEYS[2])
return 1
"""

# KEYS: lease, term, committed, finished, stream, sequence.  ARGV: token, offset, finished ranges
# ("" = none), then the reader's mark (n, ts, sha: see STREAM_INTACT_LUA).
# 1 = written, 0 = fenced off, 2 = not written: the queue no longer holds what was read (a rollback),
# so a commit point taken from what was read could skip messages written after the rollback.
LEASE_COMMIT_LUA: Final = OOM_PASS_LUA + _HOLDS + STREAM_INTACT_LUA + """
if not holds() then return 0 end
if not stream_intact(KEYS[5], KEYS[6], tonumber(ARGV[4]), ARGV[5], ARGV[6]) then return 2 end
redis.call('SET', KEYS[3], ARGV[2])
if ARGV[3] == '' then redis.call('DEL', KEYS[4]) else redis.call('SET', KEYS[4], ARGV[3]) end
return 1
"""


# Redis's own clock, in ms: member heartbeats and topic stamps are compared across proxies, so they
# are never a proxy's wall clock (TIME before a write is fine: scripts replicate their effects).
_NOW_MS: Final = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

# KEYS: members, group topics.  ARGV: instance id, member timeout (ms), topic ('' = none).
# Returns the live members. One slot (the group's hash tag); runs while Redis is full, so a full
# Redis never makes the others think this proxy left.
HEARTBEAT_LUA: Final = OOM_PASS_LUA + _NOW_MS + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('ZADD', KEYS[1], now, ARGV[1])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], ARGV[3], now) end
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

# KEYS: the group registry.  ARGV: the groups.  SADD only of those missing: a full Redis refuses SADD
# even of a member that is there, and the registry must not cost a heartbeat.
REGISTER_GROUP_LUA: Final = """
local there = redis.call('SMISMEMBER', KEYS[1], unpack(ARGV))
local missing = {}
for i = 1, #ARGV do if there[i] == 0 then missing[#missing + 1] = ARGV[i] end end
if #missing > 0 then redis.call('SADD', KEYS[1], unpack(missing)) end
return 1
"""

# HEARTBEAT_LUA for many groups of this proxy in one call (the proxy's upkeep, once per round). The
# live members are read by score, so silent members need not be removed first: the removal runs only
# when ARGV[3] is '1' (every few rounds). A group's heartbeat and topic stamps are written when its
# flag is '1' (the caller sends it every few seconds): otherwise the call only reads its members.
# KEYS: each group's members and group topics, in pairs.  ARGV: instance id, member timeout (ms),
# sweep ('1' or '0'), then per group its flag, the number of its topics and the topics. Returns
# Redis's time (ms; the caller's clock samples) and then each group's live members. Its keys span
# slots on a single Redis only: on a Cluster the caller sends one group a call.
HEARTBEAT_MANY_LUA: Final = OOM_PASS_LUA + _NOW_MS + """
local oldest, at, live = now - tonumber(ARGV[2]), 4, {now}
for i = 1, #KEYS / 2 do
  local members, n = KEYS[2 * i - 1], tonumber(ARGV[at + 1])
  if ARGV[3] == '1' then redis.call('ZREMRANGEBYSCORE', members, '-inf', oldest) end
  if ARGV[at] == '1' then redis.call('ZADD', members, now, ARGV[1]) end
  if n > 0 then
    local fields = {}
    for j = 1, n do fields[2 * j - 1] = ARGV[at + 1 + j]; fields[2 * j] = now end
    redis.call('HSET', KEYS[2 * i], unpack(fields))
  end
  at = at + n + 2
  live[i + 1] = redis.call('ZRANGEBYSCORE', members, '(' .. oldest, '+inf')
end
return live
"""

# KEYS: the lease's record.  ARGV: field, value, ttl_ms.  One key, so one slot on a Cluster, and the
# expiry is set in the same step (a death between two commands would leave a record that never expires).
LEASE_RECORD_LUA: Final = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS: lease, term, committed, finished.  ARGV: new committed offset.
# 1 = reset; 0 = a proxy holds the lease (nothing written).
OFFSETS_RESET_LUA: Final = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[3], ARGV[1])
redis.call('DEL', KEYS[4])
redis.call('INCR', KEYS[2])
return 1
"""


# What the metrics read per (group, topic): the length of its dead-letter stream and how many of its
# queues' leases exist (a queue without one has no owner). KEYS, pair after pair: the dead-letter
# stream, then that pair's lease keys.  ARGV: each pair's number of lease keys.  Returns the two counts
# of each pair in turn. Read-only; its keys span slots, so on a single Redis only: on a Cluster the
# metrics send the same reads as commands, one key each.
TOPIC_COUNTS_LUA: Final = """
local out, at = {}, 1
for i = 1, #ARGV do
  local leases = tonumber(ARGV[i])
  out[2 * i - 1] = redis.call('XLEN', KEYS[at])
  local held = 0
  for j = at + 1, at + leases do held = held + redis.call('EXISTS', KEYS[j]) end
  out[2 * i] = held
  at = at + 1 + leases
end
return out
"""
