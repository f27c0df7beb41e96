--!module needs prelude
-- distbreaker fleet-wide rate limiter: GCRA (the generic cell rate algorithm, a token
-- bucket kept as one timestamp) with reservations. A module: the helpers below are
-- defined once (at FUNCTION LOAD, or once per EVAL) and the chunk returns the entry.
--
-- The limit: `limit` permits per `period` ms, with a bucket of `burst` permits. One
-- permit costs cost_us(1) = ceil(period * 1000 / limit) microseconds of the bucket;
-- the bucket holds cap_us = floor(burst * period * 1000 / limit). The only state is
-- the theoretical arrival time `tat` (server µs): the bucket is empty up to `tat`, and
-- `backlog = max(0, tat - now)` of it is in use now. A request of n permits is
-- conforming `wait = backlog + cost_us(n) - cap_us` µs from now (at once if <= 0).
-- If that wait is within the caller's timeout, the permits are RESERVED (tat moves on
-- by cost_us(n)) and the caller runs after `wait`: callers are served in the order
-- their acquire reached Redis, fleet-wide, with no queue and no polling (Resilience4j's
-- AtomicRateLimiter reserves the same way). Else nothing is written.
--   Guarantee (exact; rounding only ever makes it stricter): over any interval of
--   length W, the permits whose run time falls in it total at most
--   burst + W * limit / period.
--
-- KEYS[1] <ns>:{<name>}:rl  hash
--   v         layout version, "1"
--   tat       theoretical arrival time, server µs (integer)
--   lim, per, bur   an operator's limit (op "set"): while present they govern every
--                   caller instead of its ARGV[2..4] (Resilience4j's changeLimitForPeriod,
--                   fleet-wide); op "unset" removes them
--   calls     calls granted         permits   permits granted (their weights' sum)
--   waited    calls granted after a wait     rejected  calls refused (the wait was too long)
--   x         server ms of the last PEXPIRE
--   cl, cp, cb  ARGV[2..4] of the call that last set the TTL (informational: lets
--               operator tools show the bucket; each call uses its own)
--   why, by, at  the last operator change of the limit (op set / unset given a reason):
--               its reason, actor and server ms (informational, shown by operator tools)
--   TTL: PEXPIRE ARGV[5] (key ttl ms) by a write when the last one is older than a
--   quarter of it; clients keep key ttl >= 2 * (longest timeout + period), so a key
--   never expires while a reservation in it lies in the future.
--
-- ARGV[1] op: acquire | drain | set | unset | metrics
-- ARGV[2] limit (permits per period, integer >= 1)   ARGV[3] period ms (integer >= 1)
-- ARGV[4] burst (integer >= 1)                       ARGV[5] key ttl ms (integer >= 1)
--         (limit * period must be <= 9e12: the arithmetic is exact in doubles)
-- ARGV[6] acquire: permits (integer in [1, burst in force])
--         set: the new limit;  ARGV[7] set: the new period ms;  ARGV[8] set: the new burst
--         unset: the reason (optional; ARGV[7] the actor)
-- ARGV[7] acquire: the longest wait ms (0: only at once)
-- ARGV[9] set: the reason (optional; ARGV[10] the actor): stored as why / by / at
--
-- Reply, acquire: {ok, wait_ms, now_ms, limit}: ok 1 = granted, run after wait_ms
--   (ceil of the wait in µs); ok 0 = refused, wait_ms is the wait it would have needed
--   (-1 when the permits exceed the burst in force); limit: the limit in force.
-- Reply, drain / set / unset / metrics: {available, limit, period_ms, burst, calls,
--   permits, waited, rejected, now_ms, overridden}: available = permits the bucket
--   could grant now (negative while reservations wait), overridden 1 when an
--   operator's limit governs.
-- Errors: "DISTBREAKER_SCHEMA <key> ..." (foreign data), "DISTBREAKER_ARGS ...".
-- Commands on the hot path (a granted acquire): TIME, HMGET, HSET (and PEXPIRE once per
-- ttl / 4). ARGV[2..5] are parsed once per distinct strings (kept by the library).

local schema_error, failed_on, args_error = prelude.schema_error, prelude.failed_on,
                                           prelude.args_error
local MAX_PRODUCT = 9e12

local function int(text)
  local n = tonumber(text)
  if n and n >= 0 and n == math.floor(n) then return n end
  return nil
end

local function bad_args(op) return args_error('bad rate limiter arguments for ' .. tostring(op)) end

local function fmt(n) return string.format('%d', n) end

-- The bucket of (limit, period, burst): {limit, period, burst, cap µs, cost of one permit
-- µs}, or nil when malformed.
local function bucket(lim, per, bur)
  if not (lim and per and bur) or lim < 1 or per < 1 or bur < 1 or lim * per > MAX_PRODUCT then
    return nil
  end
  return {lim, per, bur, math.floor(bur * per * 1000 / lim), math.ceil(per * 1000 / lim)}
end

-- ARGV[2..5] as {limit, period, burst, cap, cost1, ttl}, false when malformed; parsed
-- once per distinct strings (a function library keeps them; looked up by the four
-- strings in turn: cheaper than a key made by concatenation).
local PARSED, PARSED_N = {}, 0
local function parse(a2, a3, a4, a5)
  a2, a3, a4, a5 = a2 or '', a3 or '', a4 or '', a5 or ''
  local t2 = PARSED[a2]
  local t3 = t2 and t2[a3]
  local t4 = t3 and t3[a4]
  local g = t4 and t4[a5]
  if g == nil then
    local ttl = int(a5)
    g = bucket(int(a2), int(a3), int(a4)) or false
    if g and ttl and ttl >= 1 then g[6] = ttl else g = false end
    if PARSED_N >= 64 then PARSED, PARSED_N, t2, t3, t4 = {}, 0, nil, nil, nil end
    if not t2 then t2 = {}; PARSED[a2] = t2 end
    if not t3 then t3 = {}; t2[a3] = t3 end
    if not t4 then t4 = {}; t3[a4] = t4 end
    t4[a5], PARSED_N = g, PARSED_N + 1
  end
  return g
end

local function cost_us(n, b)
  if n == 1 then return b[5] end
  return math.ceil(n * b[2] * 1000 / b[1])
end

-- Refresh the TTL when the last refresh (x) is a quarter of it old, or when the bucket
-- reaches further ahead than half of it (an operator's long period); the fields to add
-- to the op's own HSET, appended to `fields`.
local function expire_fields(K, fields, now_ms, x, ttl, ahead_us, ARGV)
  local need = math.ceil(ahead_us / 500)  -- twice the reach, in ms
  if now_ms - x >= ttl / 4 or need > ttl then
    local i = #fields
    fields[i + 1], fields[i + 2] = 'x', fmt(now_ms)
    fields[i + 3], fields[i + 4] = 'cl', ARGV[2]
    fields[i + 5], fields[i + 6] = 'cp', ARGV[3]
    fields[i + 7], fields[i + 8] = 'cb', ARGV[4]
    return need > ttl and need or ttl
  end
  return nil
end

local function write(K, fields, pexpire)
  redis.call('HSET', K, unpack(fields))
  if pexpire then redis.call('PEXPIRE', K, pexpire) end
end

return function(KEYS, ARGV)
  local K, op = KEYS[1], ARGV[1]
  local g = parse(ARGV[2], ARGV[3], ARGV[4], ARGV[5])
  if not g then return bad_args(op) end
  local ttl = g[6]
  local n, max_wait_ms
  if op == 'acquire' then
    n = ARGV[6] == '1' and 1 or int(ARGV[6])
    max_wait_ms = (ARGV[7] == nil or ARGV[7] == '0') and 0 or int(ARGV[7])
    if not n or n < 1 or not max_wait_ms then return bad_args(op) end
  elseif op == 'set' then
    if not bucket(int(ARGV[6]), int(ARGV[7]), int(ARGV[8])) then return bad_args(op) end
  elseif op ~= 'drain' and op ~= 'unset' and op ~= 'metrics' then
    return bad_args(op)
  end

  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local now_ms = math.floor(now_us / 1000)

  local raw = redis.pcall('HMGET', K, 'v', 'tat', 'x', 'calls', 'permits', 'waited', 'lim')
  if raw['err'] then return failed_on(K, 'hash', raw) end
  local exists = raw[1] ~= false
  local tat, x = 0, 0
  local b = g
  if exists then
    if raw[1] ~= '1' then
      return schema_error(K, 'has layout version ' .. tostring(raw[1]) .. ', this client speaks 1')
    end
    tat, x = int(raw[2]), int(raw[3] or '0')
    if not tat or not x then return schema_error(K, 'has corrupt rate limiter fields') end
    if raw[7] then  -- an operator's limit governs
      local o = redis.call('HMGET', K, 'per', 'bur')
      b = bucket(int(raw[7]), int(o[1]), int(o[2]))
      if not b then return schema_error(K, 'has a corrupt operator limit') end
    end
  elseif redis.call('EXISTS', K) == 1 then
    return schema_error(K, 'is a hash without a version')
  end
  local lim, cap = b[1], b[4]
  local backlog = tat - now_us
  if backlog < 0 then backlog = 0 end

  if op == 'acquire' then
    local fields, wait_ms, c = nil, -1, 0
    if n <= b[3] then
      c = cost_us(n, b)
      local wait_us = backlog + c - cap
      wait_ms = wait_us > 0 and math.ceil(wait_us / 1000) or 0
    end
    if wait_ms < 0 or wait_ms > max_wait_ms then  -- refused: nothing reserved
      redis.call('HINCRBY', K, 'rejected', 1)
      fields = exists and {} or {'v', '1', 'tat', '0'}
      local pexpire = expire_fields(K, fields, now_ms, x, ttl, backlog, ARGV)
      if fields[1] then write(K, fields, pexpire) end
      return {0, wait_ms, now_ms, lim}
    end
    local tat_new, calls = fmt(now_us + backlog + c), (tonumber(raw[4]) or 0) + 1
    local permits = (tonumber(raw[5]) or 0) + n
    -- numbers go to Redis in their shortest form: beyond 1e14 that could be "1e+15"
    if permits >= 1e14 then calls, permits = fmt(calls), fmt(permits) end
    if exists and wait_ms == 0 and now_ms - x < ttl / 4 and backlog + c <= ttl * 500 then
      -- the hot path: one HSET of what changed, no TTL due
      redis.call('HSET', K, 'tat', tat_new, 'calls', calls, 'permits', permits)
      return {1, 0, now_ms, lim}
    end
    fields = {'tat', tat_new, 'calls', calls, 'permits', permits,
              'waited', (tonumber(raw[6]) or 0) + (wait_ms > 0 and 1 or 0)}
    if not exists then fields[9], fields[10] = 'v', '1' end
    write(K, fields, expire_fields(K, fields, now_ms, x, ttl, backlog + c, ARGV))
    return {1, wait_ms, now_ms, lim}
  end

  if op == 'drain' then  -- the bucket is empty now: what it held is spent
    if backlog < cap then
      backlog = cap
      local fields = {'v', '1', 'tat', fmt(now_us + cap)}
      write(K, fields, expire_fields(K, fields, now_ms, x, ttl, cap, ARGV))
    end
  elseif op == 'set' then
    b = bucket(int(ARGV[6]), int(ARGV[7]), int(ARGV[8]))
    lim, cap = b[1], b[4]
    local fields = {'v', '1', 'tat', fmt(tat), 'lim', fmt(b[1]), 'per', fmt(b[2]),
                    'bur', fmt(b[3])}
    if ARGV[9] then
      local i = #fields
      fields[i + 1], fields[i + 2], fields[i + 3] = 'why', ARGV[9], 'by'
      fields[i + 4], fields[i + 5], fields[i + 6] = ARGV[10] or '', 'at', fmt(now_ms)
    end
    write(K, fields, expire_fields(K, fields, now_ms, 0, ttl,
                                   backlog > cap and backlog or cap, ARGV))
  elseif op == 'unset' then
    if exists then
      redis.call('HDEL', K, 'lim', 'per', 'bur')
      if ARGV[6] then redis.call('HSET', K, 'why', ARGV[6], 'by', ARGV[7] or '', 'at', fmt(now_ms)) end
      b = g
      lim, cap = b[1], b[4]
    end
  end

  local counts = redis.call('HMGET', K, 'calls', 'permits', 'waited', 'rejected', 'lim')
  local available = math.floor((cap - backlog) / b[5])
  return {available, lim, b[2], b[3], tonumber(counts[1] or 0) or 0,
          tonumber(counts[2] or 0) or 0, tonumber(counts[3] or 0) or 0,
          tonumber(counts[4] or 0) or 0, now_ms, counts[5] and 1 or 0}
end
