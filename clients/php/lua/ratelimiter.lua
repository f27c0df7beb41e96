local prelude_value
local function prelude()
  if prelude_value == nil then prelude_value = (function()
--!lib
-- The helpers every distbreaker script shares (one definition: lua/lib/, see
-- distbreaker/_runtime/scripts.py): the two error replies the clients decode
-- (docs/KEY_SCHEMA.md, "Errors") and the foreign-type check. Globals are looked up
-- per call: this chunk runs at a script's first call, never at FUNCTION LOAD.

-- Foreign or corrupt data in `key`: 'DISTBREAKER_SCHEMA <key> <msg>'.
local function schema_error(key, msg)
  return redis.error_reply('DISTBREAKER_SCHEMA ' .. key .. ' ' .. msg)
end

-- Arguments the script refuses: 'DISTBREAKER_ARGS <msg>'.
local function args_error(msg)
  return redis.error_reply('DISTBREAKER_ARGS ' .. msg)
end

-- The schema error for a key holding a type other than `want`; nil when it holds a
-- `want` or does not exist. TYPE costs a command: scripts run it on error paths (and
-- before writes of keys they do not read first), never on every call.
local function foreign_type(key, want)
  local found = redis.call('TYPE', key)
  if type(found) == 'table' then found = found['ok'] end
  if found ~= 'none' and found ~= want then
    return schema_error(key, 'holds a ' .. found .. ', expected a ' .. want)
  end
  return nil
end

-- A command on `key` failed with `reply`: the schema error when the key holds a type
-- other than `want`, else `reply` itself (e.g. an ACL refusal on a key of the right type).
local function failed_on(key, want, reply)
  return foreign_type(key, want) or reply
end

return {schema_error = schema_error, args_error = args_error, foreign_type = foreign_type,
        failed_on = failed_on}

end)() end
  return prelude_value
end
local main = (function(prelude)
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
-- ARGV[7] acquire: the longest wait ms (0: only at once)
--
-- Reply, acquire: {ok, wait_ms, now_ms, limit}: ok 1 = granted, run after wait_ms
--   (ceil of the wait in µs); ok 0 = refused, wait_ms is the wait it would have needed
--   (-1 when the permits exceed the burst in force); limit: the limit in force.
-- Reply, drain / set / unset / metrics: {available, limit, period_ms, burst, calls,
--   permits, waited, rejected, now_ms, overridden}: available = permits the bucket
--   could grant now (negative while reservations wait), overridden 1 when an
--   operator's limit governs.
-- Errors: "DISTBREAKER_SCHEMA <key> ..." (foreign data), "DISTBREAKER_ARGS ...".
-- Commands on the hot path: TIME, HMGET, HSET (and PEXPIRE once per ttl / 4).

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

-- The bucket geometry of (limit, period, burst), or nil when malformed.
local function geometry(lim, per, bur)
  if not (lim and per and bur) or lim < 1 or per < 1 or bur < 1 or lim * per > MAX_PRODUCT then
    return nil
  end
  return math.floor(bur * per * 1000 / lim)
end

local function cost_us(n, lim, per) return math.ceil(n * per * 1000 / lim) end

return function(KEYS, ARGV)
  local K, op = KEYS[1], ARGV[1]
  local lim, per, bur, ttl = int(ARGV[2]), int(ARGV[3]), int(ARGV[4]), int(ARGV[5])
  if not geometry(lim, per, bur) or not ttl or ttl < 1 then return bad_args(op) end
  local n, max_wait_ms
  if op == 'acquire' then
    n, max_wait_ms = int(ARGV[6]), int(ARGV[7] or '0')
    if not n or n < 1 or not max_wait_ms then return bad_args(op) end
  elseif op == 'set' then
    local l2, p2, b2 = int(ARGV[6]), int(ARGV[7]), int(ARGV[8])
    if not geometry(l2, p2, b2) then return bad_args(op) end
  elseif op ~= 'drain' and op ~= 'unset' and op ~= 'metrics' then
    return bad_args(op)
  end

  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local now_ms = math.floor(now_us / 1000)

  local raw = redis.pcall('HMGET', K, 'v', 'tat', 'lim', 'per', 'bur', 'x', 'calls', 'permits',
                          'waited')
  if raw['err'] then return failed_on(K, 'hash', raw) end
  local exists = raw[1] ~= false
  local tat, x = 0, 0
  if exists then
    if raw[1] ~= '1' then
      return schema_error(K, 'has layout version ' .. tostring(raw[1]) .. ', this client speaks 1')
    end
    tat, x = int(raw[2]), int(raw[6] or '0')
    if not tat or not x then return schema_error(K, 'has corrupt rate limiter fields') end
    if raw[3] then  -- an operator's limit governs
      lim, per, bur = int(raw[3]), int(raw[4]), int(raw[5])
      if not geometry(lim, per, bur) then
        return schema_error(K, 'has a corrupt operator limit')
      end
    end
  elseif redis.call('EXISTS', K) == 1 then
    return schema_error(K, 'is a hash without a version')
  end
  local cap = geometry(lim, per, bur)
  local backlog = tat - now_us
  if backlog < 0 then backlog = 0 end

  -- The TTL is refreshed by a write when the last refresh is a quarter of it old, or
  -- when the bucket reaches further ahead than half of it (an operator's long period).
  local function expire(ahead_us)
    local need = math.ceil(ahead_us / 500)  -- twice the reach, in ms
    if now_ms - x >= ttl / 4 or need > ttl then
      redis.call('HSET', K, 'x', fmt(now_ms), 'cl', ARGV[2], 'cp', ARGV[3], 'cb', ARGV[4])
      redis.call('PEXPIRE', K, need > ttl and need or ttl)
    end
  end

  if op == 'acquire' then
    if n > bur then
      redis.call('HINCRBY', K, 'rejected', 1)
      if not exists then redis.call('HSET', K, 'v', '1', 'tat', '0') end
      expire(backlog)
      return {0, -1, now_ms, lim}
    end
    local c = cost_us(n, lim, per)
    local wait_us = backlog + c - cap
    if wait_us < 0 then wait_us = 0 end
    local wait_ms = math.ceil(wait_us / 1000)
    if wait_ms > max_wait_ms then
      redis.call('HINCRBY', K, 'rejected', 1)
      if not exists then redis.call('HSET', K, 'v', '1', 'tat', '0') end
      expire(backlog)
      return {0, wait_ms, now_ms, lim}
    end
    local tat_new = fmt(now_us + backlog + c)
    local calls, permits = (tonumber(raw[7]) or 0) + 1, (tonumber(raw[8]) or 0) + n
    if not exists then
      redis.call('HSET', K, 'v', '1', 'tat', tat_new, 'calls', 1, 'permits', n,
                 'waited', wait_ms > 0 and 1 or 0, 'rejected', 0)
    elseif wait_ms > 0 then
      redis.call('HSET', K, 'tat', tat_new, 'calls', fmt(calls), 'permits', fmt(permits),
                 'waited', fmt((tonumber(raw[9]) or 0) + 1))
    else
      redis.call('HSET', K, 'tat', tat_new, 'calls', fmt(calls), 'permits', fmt(permits))
    end
    expire(backlog + c)
    return {1, wait_ms, now_ms, lim}
  end

  if op == 'drain' then  -- the bucket is empty now: what it held is spent
    if backlog < cap then
      backlog = cap
      redis.call('HSET', K, 'v', '1', 'tat', fmt(now_us + cap))
      expire(cap)
    end
  elseif op == 'set' then
    lim, per, bur = int(ARGV[6]), int(ARGV[7]), int(ARGV[8])
    cap = geometry(lim, per, bur)
    redis.call('HSET', K, 'v', '1', 'tat', fmt(tat), 'lim', fmt(lim), 'per', fmt(per),
               'bur', fmt(bur))
    x = 0
    expire(backlog > cap and backlog or cap)
  elseif op == 'unset' then
    if exists then
      redis.call('HDEL', K, 'lim', 'per', 'bur')
      lim, per, bur = int(ARGV[2]), int(ARGV[3]), int(ARGV[4])
      cap = geometry(lim, per, bur)
    end
  end

  local counts = redis.call('HMGET', K, 'calls', 'permits', 'waited', 'rejected', 'lim')
  local available = math.floor((cap - backlog) / cost_us(1, lim, per))
  return {available, lim, per, bur, tonumber(counts[1] or 0) or 0,
          tonumber(counts[2] or 0) or 0, tonumber(counts[3] or 0) or 0,
          tonumber(counts[4] or 0) or 0, now_ms, counts[5] and 1 or 0}
end

end)(prelude())
return main(KEYS, ARGV)
