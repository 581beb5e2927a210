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
local function add_clamped_field(key, field, delta)
  local v = redis.call('HINCRBY', key, field, delta)
  if v < 0 then
    redis.call('HSET', key, field, 0)
    v = 0
  end
  return v
end
local function add_clamped(key, delta) return add_clamped_field(key, 'used', delta) end
"""

# The rate and budget windows (`controlplane.leases.windows`). A rolling window is a zset of
# attempt ids scored by their admission time, its weight sum kept in the account's window hash
# (fields minute, day; an entry's weight other than 1 in field "<window>:<attempt>"; also the
# limits and spans last seen); the month's spend is a hash
# per calendar month (UTC) of attempt_id -> cost micros plus its sum in field _sum, built from a
# prefix and the month's start (same hash tag), kept a day past its month. `month_bounds` is
# days-from-civil arithmetic in exact doubles (`windows.month_bounds_ms` is its Python twin, tested
# against it).
_WINDOWS = """
local function month_bounds(now)
  local z = math.floor(now / 86400000) + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  local function days(yy, mm)
    if mm <= 2 then yy = yy - 1 end
    local e = math.floor(yy / 400)
    local ye = yy - e * 400
    local dy = math.floor((153 * (mm > 2 and mm - 3 or mm + 9) + 2) / 5)
    return e * 146097 + ye * 365 + math.floor(ye / 4) - math.floor(ye / 100) + dy - 719468
  end
  local ny, nm = y, m + 1
  if nm > 12 then ny, nm = y + 1, 1 end
  return days(y, m) * 86400000, days(ny, nm) * 86400000
end
-- An entry's weight is 1 unless its hash field "<window>:<attempt>" says more (a Veo call's
-- sample_count), so the common entry costs no field.
local function weight(conf, field, member)
  return tonumber(redis.call('HGET', conf, field .. ':' .. member) or '1')
end
local function trim(zkey, conf, field, cutoff)
  local gone = redis.call('ZRANGEBYSCORE', zkey, '-inf', cutoff)
  if #gone > 0 then
    local w = 0
    for _, m in ipairs(gone) do
      w = w + weight(conf, field, m)
      redis.call('HDEL', conf, field .. ':' .. m)
    end
    redis.call('ZREMRANGEBYSCORE', zkey, '-inf', cutoff)
    if redis.call('HINCRBY', conf, field, -w) < 0 then redis.call('HSET', conf, field, 0) end
  end
  return tonumber(redis.call('HGET', conf, field) or '0')
end
local function reopens_in(zkey, conf, field, excess, span, now)
  local rows = redis.call('ZRANGE', zkey, 0, excess - 1, 'WITHSCORES')
  local dropped = 0
  for i = 1, #rows, 2 do
    dropped = dropped + weight(conf, field, rows[i])
    if dropped >= excess then return tonumber(rows[i + 1]) + span - now end
  end
  return -1
end
local function add_entry(zkey, conf, field, member, at, w)
  if redis.call('ZADD', zkey, 'NX', at, member) == 1 then
    redis.call('HINCRBY', conf, field, w)
    if w ~= 1 then redis.call('HSET', conf, field .. ':' .. member, w) end
    return true
  end
  return false
end
-- The windows `win` (`WindowRequest.encode`) of attempt `id` at `now`: trims, records the limits
-- and spans, and returns the refusal of the first full window this attempt is not counted in yet
-- ({name, limit, used, requested, reopens_in_ms or -1}; nil: room), the month's spend key, the
-- month's end and which windows already count the attempt.
local function check_windows(win, now, id, minute, day, conf, mprefix)
  local mstart, mend = month_bounds(now)
  local mkey = mprefix .. string.format('%d', mstart)
  redis.call('HSET', conf, 'limit_minute', win[1], 'limit_day', win[2], 'limit_month', win[3],
    'span_minute', win[6], 'span_day', win[7])
  local used = {trim(minute, conf, 'minute', now - win[6]), trim(day, conf, 'day', now - win[7]),
    tonumber(redis.call('HGET', mkey, '_sum') or '0')}
  local counted = {redis.call('ZSCORE', minute, id), redis.call('ZSCORE', day, id),
    redis.call('HEXISTS', mkey, id) == 1}
  local names = {'submits_per_minute', 'generations_per_day', 'spend_per_month'}
  local takes = {1, win[4], win[5]}
  for w = 1, 3 do
    local limit = win[w]
    if limit >= 0 and not counted[w] and used[w] + takes[w] > limit then
      local reopen = -1
      if takes[w] <= limit then
        if w == 3 then reopen = mend - now
        else
          reopen = reopens_in(w == 1 and minute or day, conf, w == 1 and 'minute' or 'day',
            used[w] + takes[w] - limit, win[5 + w], now)
        end
      end
      return {names[w], limit, used[w], takes[w], reopen}, mkey, mend, counted
    end
  end
  return nil, mkey, mend, counted
end
local function remove_entry(zkey, conf, field, member)
  if redis.call('ZREM', zkey, member) == 1 then
    add_clamped_field(conf, field, -weight(conf, field, member))
    redis.call('HDEL', conf, field .. ':' .. member)
  end
end
local function add_spend(mkey, attempt_id, cost, ttl)
  if redis.call('HSETNX', mkey, attempt_id, cost) == 1 then
    redis.call('HINCRBY', mkey, '_sum', cost)
    redis.call('PEXPIRE', mkey, ttl)
    return true
  end
  return false
end
"""

# One acquire, shared by ACQUIRE (one request) and ACQUIRE_MANY (an account's requests of a
# dispatch round, in order): the same code whatever the batch, so a batch is provably the
# sequence of its single acquires. `c` is the account's part: its keys (leases, fence, dims,
# unknown, minute, day, conf), its settings (account, retain_ms, lease_prefix, cap_prefix,
# reclaim_batch, spend_prefix) and `now`, the server time the call read. `dims` lists each
# dimension's {capacity hash key, dimension key, capacity}.
#
# Returns {code, record, reclaimed}: code 0 no capacity, 1 granted, 2 already held, 5 a window is
# full (record = {window, limit, used, requested, reopens_in_ms or -1}); `reclaimed` counts the
# expired leases of the account this acquire returned first. A grant's `record` is only
# {fence, acquired_at, expires_at}: the caller sent everything else (a batch of 256 acquires
# parsed 26 strings per lease back), an already-held lease's is the stored hash (HGETALL).
#
# Expired leases of the account are reclaimed here, so a dead worker's slots come back on the next
# acquire instead of waiting for a sweeper. Their lease and capacity keys are built from the
# prefixes rather than listed in KEYS (the script cannot know them before reading the index), but
# they carry the same hash tag, so they live in the same Cluster slot as every declared key.
_ACQUIRE_ONE = """
local function acquire(c, lease_key, id, token, slots, ttl, max_term, dims_json, win_json, dims)
  local now = c.now
  local reclaimed = 0
  local function drop_expired(key, attempt_id)
    local rec = redis.call('HMGET', key, 'dims', 'slots', 'unknown', 'expires_at')
    if rec[1] and tonumber(rec[4]) > now then return end
    if rec[1] then
      local held = tonumber(rec[2])
      for _, d in ipairs(cjson.decode(rec[1])) do add_clamped(c.cap_prefix .. d[1], -held) end
      if rec[3] == '1' then
        add_clamped(c.unknown, -held)
        redis.call('HDEL', c.unknown, 'refused')
      end
      redis.call('DEL', key)
      reclaimed = reclaimed + 1
    end
    redis.call('ZREM', c.leases, attempt_id)
  end
  local due = redis.call('ZRANGEBYSCORE', c.leases, '-inf', now, 'LIMIT', 0, c.reclaim_batch)
  for _, due_id in ipairs(due) do drop_expired(c.lease_prefix .. due_id, due_id) end
  if redis.call('EXISTS', lease_key) == 1 then
    if tonumber(redis.call('HGET', lease_key, 'expires_at')) > now then
      return {2, redis.call('HGETALL', lease_key), reclaimed}
    end
    drop_expired(lease_key, id)
  end
  local win, mkey, mend
  if win_json ~= '' then
    -- {limit minute, limit day, limit month (-1: none), generations, cost, span minute, span day}
    win = cjson.decode(win_json)
    local refusal
    refusal, mkey, mend = check_windows(win, now, id, c.minute, c.day, c.conf, c.spend_prefix)
    if refusal then return {5, refusal, reclaimed} end
  end
  for _, d in ipairs(dims) do
    local used = tonumber(redis.call('HGET', d[1], 'used') or '0')
    if used + slots > tonumber(d[3]) then return {0, {}, reclaimed} end
  end
  for _, d in ipairs(dims) do
    redis.call('HINCRBY', d[1], 'used', slots)
    redis.call('HSET', d[1], 'capacity', d[3])
    redis.call('SADD', c.dims, d[2])
  end
  local took = ''
  if win then
    -- Only what this acquire added is given back by an unsent release (`windows` module).
    local added = {
      add_entry(c.minute, c.conf, 'minute', id, now, 1) and '1' or '',
      add_entry(c.day, c.conf, 'day', id, now, win[4]) and '1' or '',
      add_spend(mkey, id, win[5], mend - now + 86400000) and mkey or '',
      win[4], win[5]}
    took = cjson.encode(added)
  end
  local fence = redis.call('INCR', c.fence)
  local expires = now + tonumber(ttl)
  redis.call('HSET', lease_key, 'attempt_id', id, 'account', c.account, 'token', token,
    'fence', fence, 'dims', dims_json, 'slots', slots, 'ttl', ttl, 'max_term', max_term,
    'acquired_at', now, 'expires_at', expires, 'unknown', 0, 'win', took)
  redis.call('PEXPIRE', lease_key, expires - now + tonumber(c.retain_ms))
  redis.call('ZADD', c.leases, expires, id)
  return {1, {fence, now, expires}, reclaimed}
end
"""

# KEYS[1] lease hash, KEYS[2] expiry index zset, KEYS[3] fence counter, KEYS[4] dimension-key set,
# KEYS[5] unknown-budget hash, KEYS[6] live marker, KEYS[7] minute window zset, KEYS[8] day window
# zset, KEYS[9] window hash, KEYS[10..] one capacity hash per dimension.
# ARGV: attempt_id, token, slots, ttl_ms, max_term_ms, retain_ms, dims_json, account,
#       fail_closed ('1' | '0'), lease-key prefix, capacity-key prefix, reclaim batch,
#       windows_json ('' = no windows: `WindowRequest.encode`), month-spend key prefix,
#       then (dimension_key, capacity) pairs aligned with KEYS[10..].
# Returns `_ACQUIRE_ONE`'s answer, or {4, {}, 0} when the account is not live (a fail-closed store
# whose data was lost and not restored yet).
ACQUIRE = (
    _PRELUDE
    + _WINDOWS
    + _ACQUIRE_ONE
    + """
if ARGV[9] == '1' and redis.call('EXISTS', KEYS[6]) == 0 then return {4, {}, 0} end
local c = {now = now_ms(''), leases = KEYS[2], fence = KEYS[3], dims = KEYS[4], unknown = KEYS[5],
  minute = KEYS[7], day = KEYS[8], conf = KEYS[9], account = ARGV[8], retain_ms = ARGV[6],
  lease_prefix = ARGV[10], cap_prefix = ARGV[11], reclaim_batch = tonumber(ARGV[12]),
  spend_prefix = ARGV[14]}
local dims = {}
for i = 10, #KEYS do
  dims[#dims + 1] = {KEYS[i], ARGV[15 + 2 * (i - 10)], ARGV[16 + 2 * (i - 10)]}
end
return acquire(c, KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[7],
  ARGV[13], dims)
"""
)

# The acquires of one account in one call (a dispatch round's, `RedisLeaseStore.admit_many`):
# `_ACQUIRE_ONE` per request in order, each seeing what the earlier ones took, each atomic on its
# own, the whole call atomic too. One server time for the call. A request's lease key and
# capacity keys are built from the prefixes (same hash tag, see `_ACQUIRE_ONE`): a round's
# requests differ only in their attempt and arguments, so sending each one's twelve keys again
# cost more than the acquire itself.
# KEYS[1] expiry index zset, KEYS[2] fence counter, KEYS[3] dimension-key set, KEYS[4]
# unknown-budget hash, KEYS[5] live marker, KEYS[6] minute window zset, KEYS[7] day window zset,
# KEYS[8] window hash.
# ARGV: retain_ms, account, fail_closed ('1' | '0'), lease-key prefix, capacity-key prefix,
#       reclaim batch, month-spend key prefix, then per request 7 values: attempt_id, token,
#       slots, ttl_ms, max_term_ms, dims_json ([[dimension key, capacity], ...]), windows_json.
# Returns one `ACQUIRE` answer per request, in order, as ONE JSON text with every number written
# as a decimal string (exact: cjson would print a number past 14 digits in floating point):
# parsing 256 nested RESP replies in Python cost as much as packing their commands did.
ACQUIRE_MANY = (
    _PRELUDE
    + _WINDOWS
    + _ACQUIRE_ONE
    + """
local function exact(v)
  if type(v) == 'number' then return string.format('%d', v) end
  if type(v) == 'table' then
    local t = {}
    for i, x in ipairs(v) do t[i] = exact(x) end
    return t
  end
  return v
end
local out = {}
local live = ARGV[3] ~= '1' or redis.call('EXISTS', KEYS[5]) == 1
local c = {now = now_ms(''), leases = KEYS[1], fence = KEYS[2], dims = KEYS[3], unknown = KEYS[4],
  minute = KEYS[6], day = KEYS[7], conf = KEYS[8], account = ARGV[2], retain_ms = ARGV[1],
  lease_prefix = ARGV[4], cap_prefix = ARGV[5], reclaim_batch = tonumber(ARGV[6]),
  spend_prefix = ARGV[7]}
for i = 8, #ARGV, 7 do
  if not live then
    out[#out + 1] = {4, {}, 0}
  else
    local dims = {}
    for _, d in ipairs(cjson.decode(ARGV[i + 5])) do
      dims[#dims + 1] = {c.cap_prefix .. d[1], d[1], string.format('%d', d[2])}
    end
    out[#out + 1] = exact(acquire(c, c.lease_prefix .. ARGV[i], ARGV[i], ARGV[i + 1],
      tonumber(ARGV[i + 2]), ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], dims))
  end
end
return cjson.encode(out)
"""
)

# Release by the holder, or reclaim by anyone once expired. Both return the slots exactly once.
# KEYS[1] lease hash, KEYS[2] expiry index, KEYS[3] unknown-budget hash, KEYS[4] minute window
# zset, KEYS[5] day window zset, KEYS[6] window hash, KEYS[7..] capacity hashes.
# ARGV: token, attempt_id, dims_json, mode ('release' | 'reclaim'), now override ('' = server TIME),
# fencing token ('' = not checked; a release whose fencing token is not the record's is refused),
# unsent ('1': nothing was sent under the lease, so the window use its acquire added goes back).
# Returns 1 if this call returned the slots, 0 otherwise.
DROP = (
    _PRELUDE
    + _WINDOWS
    + """
local rec = redis.call('HMGET', KEYS[1], 'token', 'dims', 'slots', 'unknown', 'expires_at', 'fence',
  'win')
if not rec[1] or rec[1] ~= ARGV[1] then return 0 end
if ARGV[6] ~= '' and rec[6] ~= ARGV[6] then return 0 end
if rec[2] ~= ARGV[3] then return redis.error_reply('LEASE_DIMENSIONS_MISMATCH') end
if ARGV[4] == 'reclaim' and tonumber(rec[5]) > now_ms(ARGV[5]) then return 0 end
local slots = tonumber(rec[3])
for i = 7, #KEYS do add_clamped(KEYS[i], -slots) end
if ARGV[7] == '1' and rec[7] and rec[7] ~= '' then
  -- {minute added '1', day added '1', month key ('' = not added by this acquire), generations,
  -- cost}
  local took = cjson.decode(rec[7])
  if took[1] ~= '' then remove_entry(KEYS[4], KEYS[6], 'minute', ARGV[2]) end
  if took[2] ~= '' then remove_entry(KEYS[5], KEYS[6], 'day', ARGV[2]) end
  if took[3] ~= '' and redis.call('HDEL', took[3], ARGV[2]) == 1 then
    add_clamped_field(took[3], '_sum', 0 - took[5])  -- never '-0'
  end
end
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
# hash, KEYS[5] live marker, KEYS[6] minute window zset, KEYS[7] day window zset, KEYS[8] window
# hash, then per holder its lease hash followed by its capacity hashes.
# ARGV: ttl_ms, max_term_ms, retain_ms, account, unknown cap ('' = leave), holders_json: a list of
# [attempt_id, token, fence, dims_json, slots, unknown '0'/'1', sent '0'/'1'] (all strings) in KEYS
# order, window entries json: [attempt_id, at_ms, generations, cost] each, month-spend key prefix.
# An unsent holder is rebuilt only if the account was not live (see `HeldLease.sent`); so are the
# window entries (counted once per attempt: an entry already there is left alone).
# A holder whose record exists is left alone; a missing one is recreated with its own token and
# fencing token and its slots counted. The fence counter is raised past every holder's token, so
# new grants still fence out the old ones. Marks the account live. Returns the restored ids.
RESTORE = (
    _PRELUDE
    + _WINDOWS
    + """
local now = now_ms('')
local ttl = tonumber(ARGV[1])
local max_fence = tonumber(redis.call('GET', KEYS[2]) or '0')
local restored = {}
local was_live = redis.call('EXISTS', KEYS[5]) == 1
if not was_live then
  local mstart, mend = month_bounds(now)
  local mkey = ARGV[8] .. string.format('%d', mstart)
  for _, e in ipairs(cjson.decode(ARGV[7])) do
    add_entry(KEYS[6], KEYS[8], 'minute', e[1], e[2], 1)
    add_entry(KEYS[7], KEYS[8], 'day', e[1], e[2], e[3])
    if e[2] >= mstart and e[2] < mend then add_spend(mkey, e[1], e[4], mend - now + 86400000) end
  end
end
local k = 9
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

# One account's window use, trimmed as an acquire would (the spans and limits last seen).
# KEYS[1] minute window zset, KEYS[2] day window zset, KEYS[3] window hash.
# ARGV: month-spend key prefix. Returns {minute, day, month, limit minute, limit day, limit month},
# a limit -1 when none was set or none seen yet.
USAGE = (
    _PRELUDE
    + _WINDOWS
    + """
local now = now_ms('')
local conf = redis.call('HMGET', KEYS[3], 'span_minute', 'span_day', 'limit_minute', 'limit_day',
  'limit_month')
local minute = tonumber(redis.call('HGET', KEYS[3], 'minute') or '0')
local day = tonumber(redis.call('HGET', KEYS[3], 'day') or '0')
if conf[1] then minute = trim(KEYS[1], KEYS[3], 'minute', now - tonumber(conf[1])) end
if conf[2] then day = trim(KEYS[2], KEYS[3], 'day', now - tonumber(conf[2])) end
local mstart = month_bounds(now)
local month = tonumber(redis.call('HGET', ARGV[1] .. string.format('%d', mstart), '_sum') or '0')
return {minute, day, month, tonumber(conf[3] or '-1'), tonumber(conf[4] or '-1'),
  tonumber(conf[5] or '-1')}
"""
)

# Right before a send: the attempt's rolling window entries move to now (a submit counts from
# when it leaves, not from its admission: two sends admitted a span apart could otherwise land
# closer than the span when the first one waited longer for its worker), and a window no longer
# counting it (admitted longer ago than its span) must have room for it again.
# KEYS[1] minute window zset, KEYS[2] day window zset, KEYS[3] window hash.
# ARGV: attempt_id, windows_json (`WindowRequest.encode`), month-spend key prefix.
# Returns {1} stamped, or {5, refusal} as ACQUIRE's.
STAMP = (
    _PRELUDE
    + _WINDOWS
    + """
local now = now_ms('')
local win = cjson.decode(ARGV[2])
local refusal, mkey, mend, counted = check_windows(win, now, ARGV[1], KEYS[1], KEYS[2], KEYS[3],
  ARGV[3])
if refusal then return {5, refusal} end
if counted[1] then redis.call('ZADD', KEYS[1], 'XX', now, ARGV[1])
else add_entry(KEYS[1], KEYS[3], 'minute', ARGV[1], now, 1) end
if counted[2] then redis.call('ZADD', KEYS[2], 'XX', now, ARGV[1])
else add_entry(KEYS[2], KEYS[3], 'day', ARGV[1], now, win[4]) end
if not counted[3] then add_spend(mkey, ARGV[1], win[5], mend - now + 86400000) end
return {1}
"""
)
