"""The trimmer's lease and the count of entries a group lost to a trim (docs/retention.md)."""

from __future__ import annotations

from typing import Final

from ddmq.protocol.scripts.fencing import OOM_PASS_LUA

# KEYS: a queue's trimmer lease.  ARGV: owner, ttl_ms.  1 = ours (taken or renewed), 0 = another's.
TRIMMER_HOLD_LUA: Final = OOM_PASS_LUA + """
local current = redis.call('GET', KEYS[1])
if current and current ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# TRIMMER_HOLD_LUA for many queues, and what the trimmer looks at first, in one call per round.
# KEYS: per queue its trimmer lease, sequence and stream, in threes.  ARGV: owner, ttl_ms.
# Per queue: {} when another proxy holds its trimmer lease; else the lease is taken or renewed for the
# owner and the answer is {1} for an empty stream (nothing to trim, nothing more is read) or {1, first
# entry id, its ts field, sequence}. Its keys span slots on a single Redis only: on a Cluster the
# caller sends one queue a call.
TRIMMER_PROBE_LUA: Final = OOM_PASS_LUA + """
local out = {}
for i = 1, #KEYS / 3 do
  local lease = KEYS[3 * i - 2]
  local current = redis.call('GET', lease)
  if current and current ~= ARGV[1] then
    out[i] = {}
  else
    redis.call('SET', lease, ARGV[1], 'PX', ARGV[2])
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
