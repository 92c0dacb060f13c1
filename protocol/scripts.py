"""Every Lua script the project runs in Redis, for the producers, the proxy and ``ddmq offsets reset``.

The scripts are where the produce sequence, the lease fencing and the dead-letter moves are atomic,
so they share one home in the contract both sides import; a script that composes another (the lease
commit checks :data:`STREAM_INTACT_LUA`, a replay runs :data:`PRODUCE_LUA`) includes its text. Each
touches the keys of one hash tag only (:mod:`ddmq.protocol.keys`), so it runs on a Redis Cluster as
on one server. The dead-letter scripts read entries one at a time, so a call never holds more than
its byte budget (plus one entry) in Redis's memory or in its reply.
"""

from __future__ import annotations

from typing import Final

# KEYS[1] stream, KEYS[2] sequence. ARGV[1] message count, ARGV[2] MAXLEN ('' = no trimming), then per
# message: the number of field/value items that follow, and the items. Returns the first offset.
#
# Entries another writer added (``XADD *``, or an id past the sequence) would make every later XADD
# of ours fail. When the first XADD fails, or the sequence is missing, or no message is given (the
# proxy's repair call), ``repair()`` makes room: the last offset becomes the highest ``0-<n>`` id in
# the stream if that is above the sequence, and entries with time-based ids (all sorting after every
# ``0-<n>``) are renumbered to the next offsets, fields unchanged, so the proxy reads them in place
# and dead-letters them. The stream's last id is then set back to ``0-<last>``. At most 1000 such
# entries are renumbered per call (an error beyond: the script must stay short).
_REPAIR_LUA: Final = """
local function repair()
  if redis.call('EXISTS', KEYS[1]) == 0 then return end
  local foreign = redis.call('XRANGE', KEYS[1], '1-0', '+', 'COUNT', 1000 + 1)
  if #foreign > 1000 then
    return 'ERR ' .. KEYS[1] .. ' holds more than 1000 entries with ids not of the form 0-<offset>'
  end
  for _, entry in ipairs(foreign) do redis.call('XDEL', KEYS[1], entry[1]) end
  local tail = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  if #tail > 0 then
    local top = tonumber(string.match(tail[1][1], '^0%-(%d+)$'))
    if top > last then last = top end
  end
  redis.call('XSETID', KEYS[1], string.format('0-%d', last))
  for _, entry in ipairs(foreign) do
    last = last + 1
    redis.call('XADD', KEYS[1], string.format('0-%d', last), unpack(entry[2]))
  end
end
"""

PRODUCE_LUA: Final = """
local n = tonumber(ARGV[1])
local raw = redis.call('GET', KEYS[2])
local last = tonumber(raw or '0')
""" + _REPAIR_LUA + """
if not raw or n == 0 then
  local err = repair()
  if err then return redis.error_reply(err) end
end
local head = {'XADD', KEYS[1]}
if ARGV[2] ~= '' then head = {'XADD', KEYS[1], 'MAXLEN', '~', ARGV[2]} end
local i = 3
for m = 1, n do
  local cmd = {unpack(head)}
  local id = #cmd + 1
  cmd[id] = string.format('0-%d', last + m)
  local count = tonumber(ARGV[i])
  for j = i + 1, i + count do cmd[#cmd + 1] = ARGV[j] end
  i = i + count + 1
  if m == 1 then
    local reply = redis.pcall(unpack(cmd))
    if type(reply) == 'table' and reply.err then
      local err = repair()
      if err then return redis.error_reply(err) end
      cmd[id] = string.format('0-%d', last + 1)
      redis.call(unpack(cmd))
    end
  else
    redis.call(unpack(cmd))
  end
end
redis.call('SET', KEYS[2], string.format('%d', last + n))
return last + 1
"""

#: The error prefix of a call the idempotent script refused because an earlier call of the same producer
#: on the queue has not been applied yet; nothing was written, and the producer sends both again in order.
OUT_OF_ORDER: Final = "DDMQSEQ"

#: How many of a producer's latest calls per queue the idempotent script remembers the answer of; a
#: producer never has more calls than this in flight on one queue.
CALLS_REMEMBERED: Final = 8

# The idempotent twin of PRODUCE_LUA, for the same stream and sequence keys (so producers running the
# older script keep working beside it). KEYS[1] stream, KEYS[2] sequence, KEYS[3] the producer's state
# on this queue (keys.producer_state), then one key per message that carries a dedup id, in message
# order (keys.dedup_id). ARGV[1] message count, ARGV[2] MAXLEN ('' = none), ARGV[3] the call's
# sequence number (0 = no producer state), ARGV[4] the producer's highest sequence number whose answer
# it holds, ARGV[5] the state's TTL (ms), ARGV[6] the dedup window (ms); then per message: when the
# call has dedup keys, 1 if the message carries a dedup id (and so takes the next key) else 0; the
# number of field/value items; the items. (Without dedup keys a message is laid out as in PRODUCE_LUA.)
#
# A call the state says was applied is answered from the state and writes nothing. A call is applied
# only right after the producer's previous one (its sequence number is the stored last + 1) or when the
# producer holds the answer of every earlier call (the stored state expired, was never written, or was
# lost with a failover together with the entries it described); any other call is refused with
# OUT_OF_ORDER, unwritten. A message whose dedup key exists is not written again: its answer is the
# stored offset. The answer is the first offset (an integer) when the call's messages got consecutive
# offsets, else the offsets, comma-separated (a string); the state stores it as a string.
IDEMPOTENT_PRODUCE_LUA: Final = """
local n = tonumber(ARGV[1])
local pseq = tonumber(ARGV[3])
local known = -1
if pseq > 0 then
  known = tonumber(redis.call('HGET', KEYS[3], 's') or '-1')
  if pseq <= known then
    local answer = redis.call('HGET', KEYS[3], ARGV[3])
    if not answer then
      return redis.error_reply('ERR call ' .. ARGV[3] .. ' of this producer is older than the state keeps')
    end
    return answer
  end
  if pseq ~= tonumber(ARGV[4]) + 1 and pseq ~= known + 1 then
    return redis.error_reply('""" + OUT_OF_ORDER + """ call ' .. ARGV[3] .. ' awaits an earlier call of its producer')
  end
end
local raw = redis.call('GET', KEYS[2])
local last = tonumber(raw or '0')
""" + _REPAIR_LUA + """
if not raw then
  local err = repair()
  if err then return redis.error_reply(err) end
end
local head = {'XADD', KEYS[1]}
if ARGV[2] ~= '' then head = {'XADD', KEYS[1], 'MAXLEN', '~', ARGV[2]} end
local ids = #KEYS > 3
local step = 1
if ids then step = 2 end
local i = 7
local k = 4
local written = 0
local offsets = {}
local consecutive = true
for m = 1, n do
  local dedup = nil
  if ids and ARGV[i] == '1' then
    dedup = KEYS[k]
    k = k + 1
  end
  local count = tonumber(ARGV[i + step - 1])
  local prior = dedup and redis.call('GET', dedup)
  if prior then
    offsets[m] = prior
    consecutive = false
  else
    local cmd = {unpack(head)}
    local id = #cmd + 1
    cmd[id] = string.format('0-%d', last + written + 1)
    for j = i + step, i + step - 1 + count do cmd[#cmd + 1] = ARGV[j] end
    if written == 0 then
      local reply = redis.pcall(unpack(cmd))
      if type(reply) == 'table' and reply.err then
        -- a full Redis refuses the first write of a script only: no repair then, nothing written
        if string.find(reply.err, 'OOM', 1, true) then return redis.error_reply(reply.err) end
        local err = repair()
        if err then return redis.error_reply(err) end
        cmd[id] = string.format('0-%d', last + 1)
        redis.call(unpack(cmd))
      end
    else
      redis.call(unpack(cmd))
    end
    written = written + 1
    if ids then
      offsets[m] = string.format('%d', last + written)
      if dedup then redis.call('SET', dedup, offsets[m], 'PX', ARGV[6]) end
    end
  end
  i = i + count + step
end
if written > 0 then redis.call('SET', KEYS[2], string.format('%d', last + written)) end
local answer = last + 1
local stored = string.format('%d', last + 1)
if not consecutive then
  stored = table.concat(offsets, ',')
  answer = stored
end
if pseq > 0 then
  redis.call('HSET', KEYS[3], 's', ARGV[3], ARGV[3], stored)
  redis.call('HDEL', KEYS[3], string.format('%d', pseq - """ + str(CALLS_REMEMBERED) + """))
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
end
return answer
"""


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


# KEYS: lease, term.  ARGV: owner, ttl_ms.  Returns the new term, or 0 when another owner holds it.
LEASE_ACQUIRE_LUA: Final = """
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
LEASE_RENEW_LUA: Final = _HOLDS + """
if not holds() then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS: lease, term.  ARGV: token.  1 = released, 0 = it was not ours any more.
LEASE_RELEASE_LUA: Final = _HOLDS + """
if not holds() then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

# KEYS: lease, term, committed, finished, stream, sequence.  ARGV: token, offset, finished ranges
# ("" = none), then the reader's mark (n, ts, sha: see STREAM_INTACT_LUA).
# 1 = written, 0 = fenced off, 2 = not written: the queue no longer holds what was read (a rollback),
# so a commit point taken from what was read could skip messages written after the rollback.
LEASE_COMMIT_LUA: Final = _HOLDS + STREAM_INTACT_LUA + """
if not holds() then return 0 end
if not stream_intact(KEYS[5], KEYS[6], tonumber(ARGV[4]), ARGV[5], ARGV[6]) then return 2 end
redis.call('SET', KEYS[3], ARGV[2])
if ARGV[3] == '' then redis.call('DEL', KEYS[4]) else redis.call('SET', KEYS[4], ARGV[3]) end
return 1
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


# KEYS[1] dead-letter stream. ARGV[1] start ('-' or '(<id>'), ARGV[2] most entries, ARGV[3] value cut
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

# KEYS[1] a stream. Its last entry's id, or nil (XREVRANGE from Python would carry the entry's value too).
LAST_ID_LUA: Final = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last == 0 then return false end
return last[1][1]
"""

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
