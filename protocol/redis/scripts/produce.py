"""The producers' scripts: appending to a queue under its dense offsets, plain and idempotent,
and repairing a stream another writer appended to (DESIGN.md, "Dense offsets", "Idempotent produce")."""

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

# The first XADD of a call (``cmd``, its id at ``cmd[id]``): where another writer's entries make it fail,
# repair and add it again under the next offset. A full Redis refuses only the first write of a script,
# so an OOM error means nothing was written: no repair then, the error goes back to the producer.
# ``head`` is the XADD and its MAXLEN (ARGV[2]), which every message of the call starts with.
_ADD_FIRST_LUA: Final = """
local head = {'XADD', KEYS[1]}
if ARGV[2] ~= '' then head = {'XADD', KEYS[1], 'MAXLEN', '~', ARGV[2]} end
local function add_first(cmd, id)
  local reply = redis.pcall(unpack(cmd))
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, 'OOM', 1, true) then return reply.err end
    local err = repair()
    if err then return err end
    cmd[id] = string.format('0-%d', last + 1)
    redis.call(unpack(cmd))
  end
end
"""

PRODUCE_LUA: Final = """
local n = tonumber(ARGV[1])
local raw = redis.call('GET', KEYS[2])
local last = tonumber(raw or '0')
""" + _REPAIR_LUA + _ADD_FIRST_LUA + """
if not raw or n == 0 then
  local err = repair()
  if err then return redis.error_reply(err) end
end
local i = 3
for m = 1, n do
  local cmd = {unpack(head)}
  local id = #cmd + 1
  cmd[id] = string.format('0-%d', last + m)
  local count = tonumber(ARGV[i])
  for j = i + 1, i + count do cmd[#cmd + 1] = ARGV[j] end
  i = i + count + 1
  if m == 1 then
    local err = add_first(cmd, id)
    if err then return redis.error_reply(err) end
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
""" + _REPAIR_LUA + _ADD_FIRST_LUA + """
if not raw then
  local err = repair()
  if err then return redis.error_reply(err) end
end
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
      local err = add_first(cmd, id)
      if err then return redis.error_reply(err) end
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
