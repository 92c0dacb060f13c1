"""A queue's integrity: does it still hold what was read (a Redis rollback), raising its sequence, its
last entry (DESIGN.md, "Redis rollbacks")."""

from __future__ import annotations

from typing import Final

#: Lua (a function definition): does the queue still hold what a reader read up to offset ``n``? False
#: when its end (the sequence, or the last ``0-<n>`` entry) is below ``n``, or when the entry at ``n``
#: is there with another produce time or body (SHA-1) than the one read: Redis lost writes and
#: producers wrote new entries under offsets already read. ``sha`` '' = nothing known of entry ``n``.
#: An entry that is gone while the end is past it was trimmed (MAXLEN), which is no rollback.
STREAM_INTACT_LUA: Final = """
local function stream_intact(stream, sequence, n, ts, sha)
  local top = tonumber(redis.call('GET', sequence) or '0')
  if top < n then
    local tail = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
    local last = #tail > 0 and tonumber(string.match(tail[1][1], '^0%-(%d+)$'))
    if not last or last < n then return false end
  end
  if sha == '' or n == 0 then return true end
  local entry = redis.call('XRANGE', stream, '0-' .. n, '0-' .. n)
  if #entry == 0 then return true end
  local fields, seen = entry[1][2], {}
  for i = 1, #fields, 2 do seen[fields[i]] = fields[i + 1] end
  return (tonumber(seen['ts']) or 0) == tonumber(ts) and redis.sha1hex(seen['v'] or '') == sha
end
"""

# KEYS: stream, sequence.  ARGV: n, ts, sha.  1 = intact, 0 = rolled back.
CHECK_STREAM_LUA: Final = STREAM_INTACT_LUA + """
if stream_intact(KEYS[1], KEYS[2], tonumber(ARGV[1]), ARGV[2], ARGV[3]) then return 1 end
return 0
"""

# KEYS: sequence.  ARGV: offset.  Raises the sequence to at least ``offset``; returns the sequence.
RAISE_SEQUENCE_LUA: Final = """
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
local floor = tonumber(ARGV[1])
if last < floor then redis.call('SET', KEYS[1], ARGV[1]); return floor end
return last
"""


# KEYS[1] a stream. Its last entry's id, or nil (XREVRANGE from Python would carry the entry's value too).
LAST_ID_LUA: Final = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last == 0 then return false end
return last[1][1]
"""
