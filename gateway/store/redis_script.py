"""The Lua scripts of the Redis store: each write is one of them, atomic, one round trip.

Every script gets all of a session's keys, in ``KEYS`` order (``gateway.store.redis``
describes them), and ARGV[1], ARGV[2] = the session's TTL and the ``known`` key's TTL,
in milliseconds. The fence check and the log's bounds run inside the scripts, so two
nodes racing cannot interleave.
"""

from __future__ import annotations

__all__ = ["ACQUIRE", "COMMIT", "CREATE", "KEYS", "POST", "PRELUDE", "RELEASE", "RENEW", "TRIM"]

KEYS = (
    *("record", "state", "fence", "owner", "log", "meta"),
    *("calls", "order", "settled", "inbox", "history"),
    "known",  # last: end_session keeps it
)

# Names for KEYS[i] (in KEYS order) and the TTL refresh every write script ends with.
# ARGV[1] is the session TTL in ms, ARGV[2] the `known` TTL in ms, in every script.
PRELUDE = """
local record, state, fence, owner, log, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local calls, order, settled, inbox, history = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local known = KEYS[12]
local function touch()
  for i = 1, #KEYS do
    if KEYS[i] ~= owner and KEYS[i] ~= known then redis.call('PEXPIRE', KEYS[i], ARGV[1]) end
  end
  redis.call('PEXPIRE', known, ARGV[2])
end
"""

CREATE = """
redis.call('DEL', state, log, meta, calls, order, settled, inbox, history)
redis.call('SET', record, ARGV[3])
redis.call('SET', known, '1')
touch()
"""

# ARGV: ttl, known ttl, fence ('' = unchecked), max_events, max_size, max_calls,
# has_state ('1'/'0'), state, n_events, n_events x (seq, data), n_calls,
# n_calls x (call_id, settled '1'/'0', data), history_drop, n_items, n_items x item,
# posts_taken.
# Returns 0 (lease lost) or 1.
COMMIT = """
if ARGV[3] ~= '' and redis.call('GET', fence) ~= ARGV[3] then return 0 end
if redis.call('EXISTS', record) == 0 then return 1 end
local last = tonumber(redis.call('HGET', meta, 'last') or '0')
local size = tonumber(redis.call('HGET', meta, 'size') or '0')
local i = 10
for _ = 1, tonumber(ARGV[9]) do
  local seq, data = ARGV[i], ARGV[i + 1]
  i = i + 2
  if tonumber(seq) > last then
    redis.call('XADD', log, seq .. '-0', 'd', data)
    last = tonumber(seq)
    size = size + #data
    redis.call('HSET', meta, 'last', seq)
  end
end
local length = redis.call('XLEN', log)
while length > 0 and (length > tonumber(ARGV[4]) or size > tonumber(ARGV[5])) do
  local oldest = redis.call('XRANGE', log, '-', '+', 'COUNT', 1)[1]
  redis.call('XDEL', log, oldest[1])
  size = size - #oldest[2][2]
  length = length - 1
  redis.call('HSET', meta, 'dropped', string.match(oldest[1], '^%d+'))
end
redis.call('HSET', meta, 'size', size)
if ARGV[7] == '1' then redis.call('SET', state, ARGV[8]) end
for _ = 1, tonumber(ARGV[i]) do
  local id, is_settled, data = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  i = i + 3
  local n = redis.call('HINCRBY', meta, 'calls', 1)
  redis.call('HSET', calls, id, data)
  redis.call('ZADD', order, n, id)
  if is_settled == '1' then redis.call('ZADD', settled, n, id) end
end
local excess = redis.call('ZCARD', settled) - tonumber(ARGV[6])
if excess > 0 then
  for _, id in ipairs(redis.call('ZRANGE', settled, 0, excess - 1)) do
    redis.call('HDEL', calls, id)
    redis.call('ZREM', order, id)
  end
  redis.call('ZREMRANGEBYRANK', settled, 0, excess - 1)
end
-- The transcript: its oldest items dropped, its new ones appended (never rewritten whole).
local h = i + 1
local drop = tonumber(ARGV[h])
if drop > 0 then redis.call('LTRIM', history, drop, -1) end
for k = 1, tonumber(ARGV[h + 1]) do redis.call('RPUSH', history, ARGV[h + 1 + k]) end
-- The posts this commit applied leave the inbox with it: a node that dies before its
-- commit leaves them for the next owner.
local taken = tonumber(ARGV[h + 2 + tonumber(ARGV[h + 1])])
if taken > 0 then redis.call('LTRIM', inbox, taken, -1) end
touch()
return 1
"""

# ARGV: ttl, known ttl, upto_seq.
TRIM = """
if redis.call('EXISTS', record) == 0 then return end
local gone = redis.call('XRANGE', log, '-', ARGV[3])
if #gone == 0 then return end
local size = tonumber(redis.call('HGET', meta, 'size') or '0')
for _, entry in ipairs(gone) do size = size - #entry[2][2] end
local upto = string.match(gone[#gone][1], '^%d+')
redis.call('XTRIM', log, 'MINID', tostring(tonumber(upto) + 1))
redis.call('HSET', meta, 'size', size, 'dropped', upto)
"""

# ARGV: ttl, known ttl, node, lease ttl. Returns the new fence.
ACQUIRE = """
local n = redis.call('INCR', fence)
redis.call('SET', owner, ARGV[3], 'PX', ARGV[4])
redis.call('HSET', meta, 'holder', ARGV[3])
touch()
return n
"""

# ARGV: ttl, known ttl, node, lease ttl, fence. Returns 1 if renewed, 0 if lost.
RENEW = """
if redis.call('GET', fence) ~= ARGV[5] then return 0 end
redis.call('SET', owner, ARGV[3], 'PX', ARGV[4])
touch()
return 1
"""

# ARGV: ttl, known ttl, fence.
RELEASE = """
if redis.call('GET', fence) == ARGV[3] then redis.call('DEL', owner) end
"""

# ARGV: ttl, known ttl, data, channel prefix, session id. The inbox expires with the
# record, not later: posts must not keep a dead session alive.
POST = """
local left = redis.call('PTTL', record)
if left < 0 then return end
redis.call('RPUSH', inbox, ARGV[3])
redis.call('PEXPIRE', inbox, left)
-- The lease's node; or, should its lease have lapsed (a node too busy to renew it in
-- time), the node that took it last: it may still drive the session.
local node = redis.call('GET', owner) or redis.call('HGET', meta, 'holder')
if node then redis.call('PUBLISH', ARGV[4] .. node, ARGV[5]) end
"""
