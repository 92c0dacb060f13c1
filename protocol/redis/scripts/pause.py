"""Pausing a group's deliveries: a pause's end and its expiry are counted in Redis's time (``TIME``), so
proxies and commands with skewed clocks agree on when a ``--for`` pause ends."""

from __future__ import annotations

from typing import Final

# KEYS[1] the group's pauses (hash). ARGV[1] the field (a topic, or '*'), ARGV[2] who, ARGV[3] how long in
# ms (0: until resumed). Returns the pause written, as JSON.
PAUSE_LUA: Final = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local span = tonumber(ARGV[3])
local untl = cjson.null
if span > 0 then untl = now + span end
local pause = cjson.encode({by = ARGV[2], at_ms = now, until_ms = untl})
redis.call('HSET', KEYS[1], ARGV[1], pause)
return pause
"""

# KEYS[1] the group's pauses (hash). Deletes the pauses whose end has come; returns {now (ms), field,
# pause, field, pause, ...} of the others.
PAUSES_LUA: Final = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local out = {now}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local ok, pause = pcall(cjson.decode, all[i + 1])
  local untl = ok and type(pause) == 'table' and pause.until_ms or nil
  if type(untl) == 'number' and untl <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
"""

# KEYS[1] the group's pauses (hash). Lifts every pause of the group; returns how many there were.
RESUME_ALL_LUA: Final = """
local found = redis.call('HLEN', KEYS[1])
redis.call('DEL', KEYS[1])
return found
"""
