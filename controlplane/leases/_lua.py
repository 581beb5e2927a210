"""Lua scripts of `RedisLeaseStore`. Each one runs atomically on the Redis server.

Every key a script touches is passed in KEYS, and all of them share the account's hash tag, so the
scripts run unchanged on Redis Cluster. Time comes from the server's TIME, never from the client:
all workers then agree on expiry even when their clocks drift. Redis >= 5 replicates script effects,
which makes TIME safe before writes.

A lease record is a hash. Its PX TTL is its expiry plus a retention margin. `expires_at` decides
validity; the extra retention keeps the record readable, so the reclaimer still knows which counters
to decrement.
"""

from __future__ import annotations

_PRELUDE = """
local function now_ms(override)
  if override ~= nil and override ~= '' then return tonumber(override) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function add_clamped(key, delta)
  local v = redis.call('HINCRBY', key, 'used', delta)
  if v < 0 then
    redis.call('HSET', key, 'used', 0)
    v = 0
  end
  return v
end
"""

# KEYS[1] lease hash, KEYS[2] expiry index zset, KEYS[3] fence counter, KEYS[4] dimension-key set,
# KEYS[5..] one capacity hash per dimension.
# ARGV: attempt_id, token, slots, ttl_ms, max_term_ms, retain_ms, dims_json, account,
#       then (dimension_key, capacity) pairs aligned with KEYS[5..].
# Returns {0} no capacity, {1, record} granted, {2, record} already held, {3} an expired record is
# in the way.
ACQUIRE = (
    _PRELUDE
    + """
local now = now_ms('')
if redis.call('EXISTS', KEYS[1]) == 1 then
  if tonumber(redis.call('HGET', KEYS[1], 'expires_at')) > now then
    return {2, redis.call('HGETALL', KEYS[1])}
  end
  return {3}
end
local slots = tonumber(ARGV[3])
for i = 5, #KEYS do
  local used = tonumber(redis.call('HGET', KEYS[i], 'used') or '0')
  if used + slots > tonumber(ARGV[8 + 2 * (i - 4)]) then return {0} end
end
for i = 5, #KEYS do
  redis.call('HINCRBY', KEYS[i], 'used', slots)
  redis.call('HSET', KEYS[i], 'capacity', ARGV[8 + 2 * (i - 4)])
  redis.call('SADD', KEYS[4], ARGV[7 + 2 * (i - 4)])
end
local fence = redis.call('INCR', KEYS[3])
local expires = now + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'attempt_id', ARGV[1], 'account', ARGV[8], 'token', ARGV[2],
  'fence', fence, 'dims', ARGV[7], 'slots', slots, 'ttl', ARGV[4], 'max_term', ARGV[5],
  'acquired_at', now, 'expires_at', expires, 'unknown', 0)
redis.call('PEXPIRE', KEYS[1], expires - now + tonumber(ARGV[6]))
redis.call('ZADD', KEYS[2], expires, ARGV[1])
return {1, redis.call('HGETALL', KEYS[1])}
"""
)

# Release by the holder, or reclaim by anyone once expired. Both return the slots exactly once.
# KEYS[1] lease hash, KEYS[2] expiry index, KEYS[3] unknown-budget hash, KEYS[4..] capacity hashes.
# ARGV: token, attempt_id, dims_json, mode ('release' | 'reclaim'), now override ('' = server TIME).
# Returns 1 if this call returned the slots, 0 otherwise.
DROP = (
    _PRELUDE
    + """
local rec = redis.call('HMGET', KEYS[1], 'token', 'dims', 'slots', 'unknown', 'expires_at')
if not rec[1] or rec[1] ~= ARGV[1] then return 0 end
if rec[2] ~= ARGV[3] then return redis.error_reply('LEASE_DIMENSIONS_MISMATCH') end
if ARGV[4] == 'reclaim' and tonumber(rec[5]) > now_ms(ARGV[5]) then return 0 end
local slots = tonumber(rec[3])
for i = 4, #KEYS do add_clamped(KEYS[i], -slots) end
if rec[4] == '1' then
  add_clamped(KEYS[3], -slots)
  redis.call('HDEL', KEYS[3], 'refused')
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
return 1
"""
)

# KEYS[1] lease hash, KEYS[2] expiry index. ARGV: token, attempt_id, retain_ms.
# Returns {0} when not held, else {1, record}. Expiry never shrinks and never passes acquired_at +
# max_term.
RENEW = (
    _PRELUDE
    + """
local now = now_ms('')
local rec = redis.call('HMGET', KEYS[1], 'token', 'expires_at', 'acquired_at', 'ttl', 'max_term')
if not rec[1] or rec[1] ~= ARGV[1] or tonumber(rec[2]) <= now then return {0} end
local expires = tonumber(rec[2])
local target = math.min(now + tonumber(rec[4]), tonumber(rec[3]) + tonumber(rec[5]))
if target > expires then
  expires = target
  redis.call('HSET', KEYS[1], 'expires_at', expires)
  redis.call('ZADD', KEYS[2], expires, ARGV[2])
end
redis.call('PEXPIRE', KEYS[1], expires - now + tonumber(ARGV[3]))
return {1, redis.call('HGETALL', KEYS[1])}
"""
)

# KEYS[1] lease hash, KEYS[2] unknown-budget hash (fields used, cap, refused).
# ARGV: token, mode ('mark' | 'resolve'), cap (mark only).
# Returns {-1, accepting} not held, {0, accepting} refused / was not unknown, {1, accepting} done.
UNKNOWN = (
    _PRELUDE
    + """
local function accepting()
  local u = redis.call('HMGET', KEYS[2], 'used', 'cap', 'refused')
  if u[3] then return 0 end
  if not u[2] then return 1 end
  if tonumber(u[1] or '0') < tonumber(u[2]) then return 1 end
  return 0
end
local now = now_ms('')
local rec = redis.call('HMGET', KEYS[1], 'token', 'expires_at', 'slots', 'unknown')
if not rec[1] or rec[1] ~= ARGV[1] or tonumber(rec[2]) <= now then return {-1, accepting()} end
local slots = tonumber(rec[3])
if ARGV[2] == 'resolve' then
  if rec[4] ~= '1' then return {0, accepting()} end
  add_clamped(KEYS[2], -slots)
  redis.call('HDEL', KEYS[2], 'refused')
  redis.call('HSET', KEYS[1], 'unknown', 0)
  return {1, accepting()}
end
redis.call('HSET', KEYS[2], 'cap', ARGV[3])
if rec[4] == '1' then return {1, accepting()} end
local used = tonumber(redis.call('HGET', KEYS[2], 'used') or '0')
if used + slots > tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[2], 'refused', 1)
  return {0, accepting()}
end
redis.call('HINCRBY', KEYS[2], 'used', slots)
redis.call('HSET', KEYS[1], 'unknown', 1)
return {1, accepting()}
"""
)

# Operator and reconciler writes to one counter hash.
# KEYS[1] counter hash, optional KEYS[2] dimension-key set.
# ARGV: mode ('set' | 'add'), value, is_unknown ('1' clears the refused flag when the counter
# drops), dim key. Returns the new value, clamped at 0.
ADJUST = (
    _PRELUDE
    + """
local old = tonumber(redis.call('HGET', KEYS[1], 'used') or '0')
local new = tonumber(ARGV[2])
if ARGV[1] == 'add' then new = old + new end
if new < 0 then new = 0 end
redis.call('HSET', KEYS[1], 'used', new)
if ARGV[3] == '1' and new < old then redis.call('HDEL', KEYS[1], 'refused') end
if #KEYS > 1 then redis.call('SADD', KEYS[2], ARGV[4]) end
return new
"""
)
