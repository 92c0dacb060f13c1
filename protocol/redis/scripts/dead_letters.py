"""Dead letters: pages, claims, replays and purges, each bounded by a byte budget per call."""

from __future__ import annotations

from typing import Final

from ddmq.protocol.redis.scripts.produce import PRODUCE_LUA

# (bytes), ARGV[4] byte budget, ARGV[5] the value's field name. Returns {more, entry...}, each entry
# {id, full value length, field, value, ...} with the value cut to ARGV[3] bytes. Stops before the entry
# that would pass the budget (always returns one when there is one); ``more`` is 1 when entries follow.
PAGE_LUA: Final = """
local start, most, cut, budget = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {0}
local used = 0
while #out - 1 < most do
  local found = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', 1)
  if #found == 0 then return out end
  local id, fields = found[1][1], found[1][2]
  local size, length = 0, 0
  for i = 1, #fields, 2 do
    if fields[i] == ARGV[5] then
      length = #fields[i + 1]
      if length > cut then fields[i + 1] = string.sub(fields[i + 1], 1, cut) end
    end
    size = size + #fields[i] + #fields[i + 1]
  end
  if #out > 1 and used + size > budget then
    out[1] = 1
    return out
  end
  used = used + size
  out[#out + 1] = {id, length, fields}
  start = '(' .. id
end
if #redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', 1) > 0 then out[1] = 1 end
return out
"""

# KEYS[1] dead-letter stream, KEYS[2] claims stream. ARGV[1] now (ms), ARGV[2] most entries, ARGV[3] byte
# budget, ARGV[4] 'range' or 'ids', then for 'range' the last id to take, for 'ids' the ids. Moves
# entries (oldest first, or in the order given) from the stream into the claims stream with their
# dead-letter id in field ``dlq_id``, stopping at the budget (at least one entry moves). Returns
# {ids examined, claims...}; each claim is an entry of the claims stream as XRANGE returns it. An id not
# in the stream is examined and not claimed (someone else replayed or purged it).
CLAIM_LUA: Final = """
local most, budget, mode = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local out = {0}
local used = 0
local function claim(id, fields)
  local size = 0
  for i = 1, #fields do size = size + #fields[i] end
  if #out > 1 and used + size > budget then return false end
  used = used + size
  local claimed = {'dlq_id', id, 'claimed_ms', ARGV[1], unpack(fields)}
  local claim_id = redis.call('XADD', KEYS[2], '*', unpack(claimed))
  redis.call('XDEL', KEYS[1], id)
  out[#out + 1] = {claim_id, claimed}
  return true
end
if mode == 'range' then
  while #out - 1 < most do
    local found = redis.call('XRANGE', KEYS[1], '-', ARGV[5], 'COUNT', 1)
    if #found == 0 or not claim(found[1][1], found[1][2]) then break end
    out[1] = out[1] + 1
  end
else
  for i = 5, #ARGV do
    if #out - 1 >= most then break end
    local found = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i], 'COUNT', 1)
    if #found > 0 and not claim(found[1][1], found[1][2]) then break end
    out[1] = out[1] + 1
  end
end
return out
"""

# KEYS[1] claims stream. ARGV[1] start ('-' or '(<id>'), ARGV[2] most entries, ARGV[3] byte budget.
# Returns claims oldest first as XRANGE does, stopping at the budget (at least one).
CLAIMS_LUA: Final = """
local start, most, budget = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
local used = 0
while #out < most do
  local found = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', 1)
  if #found == 0 then break end
  local size = 0
  for _, item in ipairs(found[1][2]) do size = size + #item end
  if #out > 0 and used + size > budget then break end
  used = used + size
  out[#out + 1] = found[1]
  start = '(' .. found[1][1]
end
return out
"""

# KEYS[1] stream, KEYS[2] sequence, KEYS[3] replay markers (zset). ARGV as PRODUCE_LUA's (count, MAXLEN,
# then per message its item count and items), then per message its dead-letter id, then now (ms) and
# how long markers are kept. Messages whose dead-letter id is marked are left out; the others are
# produced (PRODUCE_LUA's own code, unchanged) and marked in the same script. Returns {first offset or
# 0, messages produced}.
REPLAY_LUA: Final = (
    """
local n = tonumber(ARGV[1])
local starts = {}
local at = 3
for m = 1, n do
  starts[m] = at
  at = at + tonumber(ARGV[at]) + 1
end
local now, keep = tonumber(ARGV[at + n]), tonumber(ARGV[at + n + 1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now - keep))
local args, fresh = {'0', ARGV[2]}, {}
for m = 1, n do
  local id = ARGV[at + m - 1]
  if not redis.call('ZSCORE', KEYS[3], id) then
    fresh[#fresh + 1] = id
    for j = starts[m], starts[m] + tonumber(ARGV[starts[m]]) do args[#args + 1] = ARGV[j] end
  end
end
if #fresh == 0 then return {0, 0} end
args[1] = tostring(#fresh)
local total = #ARGV
for j = 1, total do ARGV[j] = nil end
for j = 1, #args do ARGV[j] = args[j] end
local function produce()
"""
    + PRODUCE_LUA
    + """
end
local first = produce()
if type(first) == 'table' then return first end
for _, id in ipairs(fresh) do redis.call('ZADD', KEYS[3], now, id) end
redis.call('PEXPIRE', KEYS[3], keep)
return {first, #fresh}
"""
)


# KEYS[1] dead-letter stream. ARGV[1] last id to delete, ARGV[2] most entries, ARGV[3] byte budget. Deletes
# the oldest entries up to ARGV[1], one at a time, until ARGV[2] are gone or their bytes pass the budget;
# returns how many.
PURGE_LUA: Final = """
local most, budget = tonumber(ARGV[2]), tonumber(ARGV[3])
local deleted, used = 0, 0
while deleted < most and used < budget do
  local found = redis.call('XRANGE', KEYS[1], '-', ARGV[1], 'COUNT', 1)
  if #found == 0 then break end
  for _, item in ipairs(found[1][2]) do used = used + #item end
  redis.call('XDEL', KEYS[1], found[1][1])
  deleted = deleted + 1
end
return deleted
"""
