-- distbreaker fleet-wide bulkhead, key schema v1: a Redis semaphore of leases.
--
-- Keys (all under the name's hash tag, like the breaker's):
-- KEYS[1] leases  <prefix>:v1:{<name>}:bh         zset  member = holder token (any
--                       string; Python uses 24 hex chars), score = lease deadline (server ms)
-- KEYS[2] meta    <prefix>:v1:{<name>}:bh:meta    hash  counters and registered waiters:
--                       rejected  calls refused (full on a fail-fast or last-try acquire)
--                       acquired  permits granted
--                       lost      renewals or releases that found their lease gone
--                       limit     max_concurrent_calls of the last writing caller
--                                 (informational: each call's ARGV[3] governs it)
--                       w:<token> a waiter's deadline (server ms), reaped when passed
-- KEYS[3] notify  <prefix>:v1:{<name>}:bh:notify  list  one element ("1") per wake-up
--                       owed to waiters; a refused waiter BLPOPs it with a timeout of at
--                       most min(its remaining wait, next_deadline_in_ms), then acquires again
-- TTLs: every key written by an op gets PEXPIRE key ttl (ARGV[5]); an empty zset or
-- list simply does not exist. Foreign types give 'DISTBREAKER_SCHEMA <key> ...'.
--
-- ARGV[1] op: acquire | release | renew | cancel | metrics
-- ARGV[2] holder token ("" for metrics)
-- ARGV[3] max_concurrent_calls (integer >= 1)
-- ARGV[4] lease ms (acquire, renew: the new deadline is now + lease)
-- ARGV[5] key ttl ms (every written key gets this PEXPIRE)
-- ARGV[6] acquire: wait ms; 0 = fail fast or last try (when full: counts a rejection
--         and unregisters the token as a waiter), > 0 = when full, register (or
--         refresh) the token as a waiter until now + wait ms (Python sends its
--         remaining wait + 1000 ms of grace); other ops: 0
--
-- Every op reads TIME once, reads meta (HGETALL) and the notify length (LLEN)
-- before any write (a key of a foreign type is reported before anything is
-- written), then reaps expired leases (ZREMRANGEBYSCORE -inf now) and waiters
-- whose deadline passed, and ends by making the notify list hold
-- exactly min(free permits, waiters) elements, so a release (or a reaped lease)
-- wakes one waiter, and no stale wake-up outlives the free permit it announced.
--
-- Reply (all integers): {ok, in_use, limit, waiting, rejected, next_deadline_in_ms,
--                        now_ms, lost, acquired}
--   ok: acquire 1 = granted (also when the token already held a lease: it is
--       refreshed), 0 = full; release 1 = the lease was held, 0 = it had expired
--       or vanished (counted as lost); renew 1 = renewed, 0 = lost (counted);
--       cancel (an interrupted acquire: drops the token's lease, if granted, and its
--       waiter registration, counting nothing), metrics: 1
--   next_deadline_in_ms: ms until the earliest lease deadline (0: no lease), the
--       longest a waiter needs to block before a reaped lease may free a permit.

local K_LEASES, K_META, K_NOTIFY = KEYS[1], KEYS[2], KEYS[3]
local op, token = ARGV[1], ARGV[2]
local limit, lease_ms, ttl_ms = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local wait_ms = tonumber(ARGV[6] or '0')  -- acquire only; other ops send 0

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if not limit or limit < 1 or not lease_ms or lease_ms < 1 or not ttl_ms or ttl_ms < 1
    or not wait_ms or wait_ms < 0 then
  return redis.error_reply('DISTBREAKER_ARGS bad bulkhead arguments')
end

-- Foreign data (the same two helpers in every script) ----------------------------
local function schema_error(key, msg)
  return redis.error_reply('DISTBREAKER_SCHEMA ' .. key .. ' ' .. msg)
end

-- The schema error for a key holding a type other than want; nil when it holds
-- a want or does not exist.
local function foreign_type(key, want)
  local found = redis.call('TYPE', key)
  if type(found) == 'table' then found = found['ok'] end
  if found ~= 'none' and found ~= want then
    return schema_error(key, 'holds a ' .. found .. ', expected a ' .. want)
  end
end

-- Read every key before the first write, so a schema error never leaves a
-- partial write behind. The reads run under pcall: a command on a key of a
-- foreign type fails without writing, and only then does foreign_type run TYPE
-- to name what was found (no TYPE on the happy path). A failure on a key of
-- the right type (an ACL refusal) is passed on as it is.
local function failed(reply) return type(reply) == 'table' and reply['err'] ~= nil end

local meta = redis.pcall('HGETALL', K_META)
if failed(meta) then return foreign_type(K_META, 'hash') or meta end
local have = redis.pcall('LLEN', K_NOTIFY)
if failed(have) then return foreign_type(K_NOTIFY, 'list') or have end

local counters = {rejected = 0, acquired = 0, lost = 0, limit = 0}
local waiters = {}
local waiting = 0
local expired = {}
for i = 1, #meta, 2 do
  local field, value = meta[i], tonumber(meta[i + 1])
  if value == nil then
    return schema_error(K_META, 'field ' .. field .. ' is not a number')
  end
  if string.sub(field, 1, 2) == 'w:' then
    if value <= now then
      expired[#expired + 1] = field
    else
      waiters[field] = value
      waiting = waiting + 1
    end
  elseif counters[field] ~= nil then
    counters[field] = value
  end
end

-- Reap expired leases and waiters (the first write) ------------------------------
local reaped = redis.pcall('ZREMRANGEBYSCORE', K_LEASES, '-inf', now)
if failed(reaped) then return foreign_type(K_LEASES, 'zset') or reaped end
if #expired > 0 then redis.call('HDEL', K_META, unpack(expired)) end

local wrote = #expired > 0
local function incr(field, by)
  counters[field] = redis.call('HINCRBY', K_META, field, by)
  wrote = true
end
local function drop_waiter(tok)
  local f = 'w:' .. tok
  if waiters[f] then
    redis.call('HDEL', K_META, f)
    waiters[f] = nil
    waiting = waiting - 1
    wrote = true
  end
end

-- The op --------------------------------------------------------------------------
local ok = 1
local in_use = redis.call('ZCARD', K_LEASES)

if op == 'acquire' then
  if token == '' then return redis.error_reply('DISTBREAKER_ARGS acquire needs a token') end
  -- ZSCORE only when full: a free permit is granted (or the lease refreshed) by ZADD.
  if in_use < limit or redis.call('ZSCORE', K_LEASES, token) then
    if redis.call('ZADD', K_LEASES, now + lease_ms, token) == 1 then
      in_use = in_use + 1
      incr('acquired', 1)
    end
    drop_waiter(token)
    wrote = true
  else
    ok = 0
    if wait_ms > 0 then
      local f = 'w:' .. token
      if not waiters[f] then waiting = waiting + 1 end
      waiters[f] = now + wait_ms
      redis.call('HSET', K_META, f, now + wait_ms)
      wrote = true
    else
      drop_waiter(token)
      incr('rejected', 1)
    end
  end
elseif op == 'release' then
  if redis.call('ZREM', K_LEASES, token) == 1 then
    in_use = in_use - 1
    wrote = true
  else
    ok = 0
    incr('lost', 1)
  end
elseif op == 'renew' then
  if redis.call('ZSCORE', K_LEASES, token) then
    redis.call('ZADD', K_LEASES, 'XX', now + lease_ms, token)
    wrote = true
  else
    ok = 0
    incr('lost', 1)
  end
elseif op == 'cancel' then
  if redis.call('ZREM', K_LEASES, token) == 1 then in_use = in_use - 1 end
  drop_waiter(token)
  wrote = true
elseif op ~= 'metrics' then
  return redis.error_reply('DISTBREAKER_ARGS unknown bulkhead op ' .. tostring(op))
end

if wrote and counters.limit ~= limit then
  redis.call('HSET', K_META, 'limit', limit)
  counters.limit = limit
end

-- Owe exactly min(free, waiting) wake-ups -----------------------------------------
local free = limit - in_use
if free < 0 then free = 0 end
local want = math.min(free, waiting)
if have < want then
  for _ = have + 1, want do redis.call('LPUSH', K_NOTIFY, '1') end
  wrote = true
elseif have > want then
  if want == 0 then redis.call('DEL', K_NOTIFY) else redis.call('LTRIM', K_NOTIFY, 0, want - 1) end
end

if wrote then
  redis.call('PEXPIRE', K_META, ttl_ms)
  if in_use > 0 then redis.call('PEXPIRE', K_LEASES, ttl_ms) end
  if want > 0 then redis.call('PEXPIRE', K_NOTIFY, ttl_ms) end
end

local next_in = 0
if in_use > 0 then
  local first = redis.call('ZRANGE', K_LEASES, 0, 0, 'WITHSCORES')
  if #first == 2 then
    next_in = tonumber(first[2]) - now
    if next_in < 1 then next_in = 1 end
  end
end

return {ok, in_use, limit, waiting, counters.rejected, next_in, now, counters.lost,
        counters.acquired}
