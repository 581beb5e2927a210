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
# KEYS[5] unknown-budget hash, KEYS[6] live marker, KEYS[7..] one capacity hash per dimension.
# ARGV: attempt_id, token, slots, ttl_ms, max_term_ms, retain_ms, dims_json, account,
#       fail_closed ('1' | '0'), lease-key prefix, capacity-key prefix, reclaim batch,
#       then (dimension_key, capacity) pairs aligned with KEYS[7..].
# Returns {code, record, reclaimed}: code 0 no capacity, 1 granted, 2 already held, 4 the account
# is not live (fail-closed store whose data was lost and not restored yet); `reclaimed` counts the
# expired leases of the account this call returned first. A grant's `record` is only
# {fence, acquired_at, expires_at}: the caller sent everything else (a batch of 256 acquires
# parsed 26 strings per lease back), an already-held lease's is the stored hash (HGETALL).
#
# Expired leases of the account are reclaimed here, so a dead worker's slots come back on the next
# acquire instead of waiting for a sweeper. Their lease and capacity keys are built from the
# prefixes rather than listed in KEYS (the script cannot know them before reading the index), but
# they carry the same hash tag, so they live in the same Cluster slot as every declared key.
ACQUIRE = (
    _PRELUDE
    + """
if ARGV[9] == '1' and redis.call('EXISTS', KEYS[6]) == 0 then return {4, {}, 0} end
local now = now_ms('')
local reclaimed = 0
local function drop_expired(lease_key, attempt_id)
  local rec = redis.call('HMGET', lease_key, 'dims', 'slots', 'unknown', 'expires_at')
  if rec[1] and tonumber(rec[4]) > now then return end
  if rec[1] then
    local slots = tonumber(rec[2])
    for _, d in ipairs(cjson.decode(rec[1])) do add_clamped(ARGV[11] .. d[1], -slots) end
    if rec[3] == '1' then
      add_clamped(KEYS[5], -slots)
      redis.call('HDEL', KEYS[5], 'refused')
    end
    redis.call('DEL', lease_key)
    reclaimed = reclaimed + 1
  end
  redis.call('ZREM', KEYS[2], attempt_id)
end
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[12]))
for _, id in ipairs(due) do drop_expired(ARGV[10] .. id, id) end
if redis.call('EXISTS', KEYS[1]) == 1 then
  if tonumber(redis.call('HGET', KEYS[1], 'expires_at')) > now then
    return {2, redis.call('HGETALL', KEYS[1]), reclaimed}
  end
  drop_expired(KEYS[1], ARGV[1])
end
local slots = tonumber(ARGV[3])
for i = 7, #KEYS do
  local used = tonumber(redis.call('HGET', KEYS[i], 'used') or '0')
  if used + slots > tonumber(ARGV[12 + 2 * (i - 6)]) then return {0, {}, reclaimed} end
end
for i = 7, #KEYS do
  redis.call('HINCRBY', KEYS[i], 'used', slots)
  redis.call('HSET', KEYS[i], 'capacity', ARGV[12 + 2 * (i - 6)])
  redis.call('SADD', KEYS[4], ARGV[11 + 2 * (i - 6)])
end
local fence = redis.call('INCR', KEYS[3])
local expires = now + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'attempt_id', ARGV[1], 'account', ARGV[8], 'token', ARGV[2],
  'fence', fence, 'dims', ARGV[7], 'slots', slots, 'ttl', ARGV[4], 'max_term', ARGV[5],
  'acquired_at', now, 'expires_at', expires, 'unknown', 0)
redis.call('PEXPIRE', KEYS[1], expires - now + tonumber(ARGV[6]))
redis.call('ZADD', KEYS[2], expires, ARGV[1])
return {1, {fence, now, expires}, reclaimed}
"""
)

# Release by the holder, or reclaim by anyone once expired. Both return the slots exactly once.
# KEYS[1] lease hash, KEYS[2] expiry index, KEYS[3] unknown-budget hash, KEYS[4..] capacity hashes.
# ARGV: token, attempt_id, dims_json, mode ('release' | 'reclaim'), now override ('' = server TIME),
# fencing token ('' = not checked; a release whose fencing token is not the record's is refused).
# Returns 1 if this call returned the slots, 0 otherwise.
DROP = (
    _PRELUDE
    + """
local rec = redis.call('HMGET', KEYS[1], 'token', 'dims', 'slots', 'unknown', 'expires_at', 'fence')
if not rec[1] or rec[1] ~= ARGV[1] then return 0 end
if ARGV[6] ~= '' and rec[6] ~= ARGV[6] then return 0 end
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

# KEYS[1] lease hash, KEYS[2] expiry index. ARGV: token, attempt_id, retain_ms, fencing token.
# Returns {0} when not held, else {1, record}. Expiry never shrinks and never passes acquired_at +
# max_term.
RENEW = (
    _PRELUDE
    + """
local now = now_ms('')
local rec = redis.call('HMGET', KEYS[1], 'token', 'expires_at', 'acquired_at', 'ttl', 'max_term',
  'fence')
if not rec[1] or rec[1] ~= ARGV[1] or rec[6] ~= ARGV[4] or tonumber(rec[2]) <= now then
  return {0}
end
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
# ARGV: token, mode ('mark' | 'resolve'), cap (mark only), fencing token.
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
local rec = redis.call('HMGET', KEYS[1], 'token', 'expires_at', 'slots', 'unknown', 'fence')
if not rec[1] or rec[1] ~= ARGV[1] or rec[5] ~= ARGV[4] or tonumber(rec[2]) <= now then
  return {-1, accepting()}
end
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

# Rebuild an account's leases from PostgreSQL's holders after the store lost them (9.11.2).
# KEYS[1] expiry index, KEYS[2] fence counter, KEYS[3] dimension-key set, KEYS[4] unknown-budget
# hash, KEYS[5] live marker, then per holder its lease hash followed by its capacity hashes.
# ARGV: ttl_ms, max_term_ms, retain_ms, account, unknown cap ('' = leave), holders_json: a list of
# [attempt_id, token, fence, dims_json, slots, unknown '0'/'1', sent '0'/'1'] (all strings) in KEYS
# order. An unsent holder is rebuilt only if the account was not live (see `HeldLease.sent`).
# A holder whose record exists is left alone; a missing one is recreated with its own token and
# fencing token and its slots counted. The fence counter is raised past every holder's token, so
# new grants still fence out the old ones. Marks the account live. Returns the restored ids.
RESTORE = (
    _PRELUDE
    + """
local now = now_ms('')
local ttl = tonumber(ARGV[1])
local max_fence = tonumber(redis.call('GET', KEYS[2]) or '0')
local restored = {}
local was_live = redis.call('EXISTS', KEYS[5]) == 1
local k = 6
for _, h in ipairs(cjson.decode(ARGV[6])) do
  local lease_key = KEYS[k]
  local dims = cjson.decode(h[4])
  local fence = tonumber(h[3])
  if fence > max_fence then max_fence = fence end
  if redis.call('EXISTS', lease_key) == 0 and (h[7] == '1' or not was_live) then
    local slots = tonumber(h[5])
    for j, d in ipairs(dims) do
      redis.call('HINCRBY', KEYS[k + j], 'used', slots)
      redis.call('HSET', KEYS[k + j], 'capacity', d[2])
      redis.call('SADD', KEYS[3], d[1])
    end
    if h[6] == '1' then redis.call('HINCRBY', KEYS[4], 'used', slots) end
    redis.call('HSET', lease_key, 'attempt_id', h[1], 'account', ARGV[4], 'token', h[2],
      'fence', h[3], 'dims', h[4], 'slots', h[5], 'ttl', ARGV[1], 'max_term', ARGV[2],
      'acquired_at', now, 'expires_at', now + ttl, 'unknown', h[6])
    redis.call('PEXPIRE', lease_key, ttl + tonumber(ARGV[3]))
    redis.call('ZADD', KEYS[1], now + ttl, h[1])
    restored[#restored + 1] = h[1]
  end
  k = k + 1 + #dims
end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[4], 'cap', ARGV[5]) end
redis.call('SET', KEYS[2], max_fence)
redis.call('SET', KEYS[5], now)
return restored
"""
)
