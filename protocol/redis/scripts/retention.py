"""The trimmer's lease and the count of entries a group lost to a trim (docs/retention.md)."""

from __future__ import annotations

from typing import Final

from ddmq.protocol.redis.scripts.fencing import OOM_PASS_LUA

# What the trimmer looks at first of many queues, taking or renewing their trimmer leases, in one call.
# KEYS: per queue its trimmer lease, sequence and stream, in threes.  ARGV: owner, ttl_ms, and a string
# with one character per queue, '1' where the owner held the lease at its last look, else '0'.
# Per queue: {} when another proxy holds its trimmer lease; else the lease is taken or renewed for the
# owner and the answer is {1} for an empty stream (nothing to trim, nothing more is read) or {1, first
# entry id, its ts field, sequence}. Its keys span slots on a single Redis only: on a Cluster the
# caller sends one queue a call.
#
# The lease costs one command per queue: GETEX renews a lease the owner held (it answers the holder
# and sets the expiry in one step), SET NX takes a free one. GETEX sets the expiry whoever holds the
# key: when it answers another proxy's name (the owner's lease lapsed, a round having stalled past the
# TTL, and that proxy took the queue over), it has given that proxy's lease one more TTL. That is
# harmless: the trimmer lease only keeps two proxies from doing the same work (trims are idempotent:
# XTRIM MINID below a floor every trimmer computes the same way), a live holder renews it anyway, and
# the owner sends GETEX again only after it holds the lease again (this answer makes it send SET NX),
# so a dead holder is replaced at most one TTL later. A SET NX refused is followed by a GET: a lease
# naming the owner (a proxy restarted under the same instance id) is its own, renewed with PEXPIRE.
TRIMMER_PROBE_LUA: Final = OOM_PASS_LUA + """
local out = {}
for i = 1, #KEYS / 3 do
  local lease = KEYS[3 * i - 2]
  local ours
  if string.sub(ARGV[3], i, i) == '1' then
    local current = redis.call('GETEX', lease, 'PX', ARGV[2])
    ours = current == ARGV[1] or (not current and redis.call('SET', lease, ARGV[1], 'NX', 'PX', ARGV[2]))
  else
    ours = redis.call('SET', lease, ARGV[1], 'NX', 'PX', ARGV[2])
    if not ours and redis.call('GET', lease) == ARGV[1] then
      redis.call('PEXPIRE', lease, ARGV[2])
      ours = true
    end
  end
  if not ours then
    out[i] = {}
  else
    local first = redis.call('XRANGE', KEYS[3 * i], '-', '+', 'COUNT', 1)[1]
    if first then
      local ts = ''
      for j = 1, #first[2], 2 do if first[2][j] == 'ts' then ts = first[2][j + 1] end end
      out[i] = {1, first[1], ts, redis.call('GET', KEYS[3 * i - 1]) or ''}
    else
      out[i] = {1}
    end
  end
end
return out
"""

# KEYS: a queue's trimmer lease.  ARGV: owner.
TRIMMER_DROP_LUA: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""

# KEYS: a group's expired counters on a queue.  ARGV: first, last, now (ms). Counts the offsets of
# first..last past the last one counted before (a queue's next owner may read the same gap again) and
# returns how many.
EXPIRED_RECORD_LUA: Final = OOM_PASS_LUA + """
local first, last = tonumber(ARGV[1]), tonumber(ARGV[2])
local counted = tonumber(redis.call('HGET', KEYS[1], 'last') or '0')
if first <= counted then first = counted + 1 end
if first > last then return 0 end
redis.call('HINCRBY', KEYS[1], 'count', last - first + 1)
redis.call('HSET', KEYS[1], 'first', first, 'last', last, 'at_ms', ARGV[3])
return last - first + 1
"""
