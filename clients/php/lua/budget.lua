-- distbreaker retry budget (Finagle semantics), key schema v1.
--
-- One budget per protected name, shared by the fleet. Every logical request
-- deposits once, every retry withdraws once; over the last ttl the budget is
--   balance = floor(min_retries_per_sec * ttl + percent_can_retry * deposits)
--             - withdrawals
-- and a withdrawal succeeds only when balance >= 1. Integer arithmetic only:
-- the reserve and the percentage arrive in millionths, so floor() is exact.
--
-- KEYS[1] slices hash  <prefix>:v1:{<name>}:rb
--   v           schema version, "1"
--   slice_ms    slice length in ms   } the window geometry, fixed by the first
--   n           slices per window    } writer until the key expires or is deleted
--   head        id of the newest slice (slice id = floor(server_ms / slice_ms))
--   D, W        running totals of deposits / withdrawals over the live slices
--   d:<id>      deposits in slice <id>      (only the last n slices exist:
--   w:<id>      withdrawals in slice <id>    older ones are evicted lazily)
--   ppm, reserve  the last writer's ARGV[2] and ARGV[3] (informational: lets
--                 operator tools show the balance; each call uses its own)
--   TTL: PEXPIRE (n + 1) * slice_ms, refreshed by every deposit and withdrawal.
--
-- ARGV[1] op: deposit | withdraw | balance
-- ARGV[2] percent_can_retry in millionths (0.2 -> 200000)
-- ARGV[3] reserve = min_retries_per_sec * ttl in millionths (10/s, 10 s -> 100000000)
-- ARGV[4] ttl in ms   ARGV[5] slices per ttl (1-100)
-- ARGV[6] amount: deposits to add (deposit: integer >= 1; other ops ignore it, send 1)
-- ARGV[7] optional, withdraw and balance only: deposits to add first (integer >= 0,
--         default 0), so a client can batch its deposits into its next call
--
-- Reply: {ok, balance, deposits, withdrawals, now_ms, drift}
--   ok: 1 (deposit, balance: always; withdraw: 1 if taken, 0 if exhausted)
--   balance: the balance after the operation (may be negative after drift)
--   deposits, withdrawals: D and W over the live window
--   drift: 1 when the stored geometry differs from ARGV[4]/ARGV[5] (stored wins)
-- Errors: "DISTBREAKER_SCHEMA <key> ..." (foreign data), "DISTBREAKER_ARGS ...".

local K = KEYS[1]
local op = ARGV[1]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Foreign data (the same two helpers in every script) ------------------------
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

local err = foreign_type(K, 'hash')
if err then return err end

local ppm, reserve = tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl_ms, want_n = tonumber(ARGV[4]), tonumber(ARGV[5])
local amount
if op == 'deposit' then
  amount = tonumber(ARGV[6] or '1')
  if amount and amount < 1 then amount = nil end
else
  amount = tonumber(ARGV[7] or '0')
end
if (op ~= 'deposit' and op ~= 'withdraw' and op ~= 'balance') or not ppm or ppm < 0
    or not reserve or reserve < 0 or not ttl_ms or ttl_ms < 1 or not want_n
    or want_n < 1 or want_n > 100 or not amount or amount < 0
    or amount ~= math.floor(amount) then
  return redis.error_reply('DISTBREAKER_ARGS bad budget arguments for ' .. tostring(op))
end

local raw = redis.call('HMGET', K, 'v', 'slice_ms', 'n', 'head', 'D', 'W')
local exists = raw[1] ~= false
if exists and raw[1] ~= '1' then
  return schema_error(K, 'has schema version ' .. tostring(raw[1]) .. ', this client speaks 1')
end
if not exists and redis.call('EXISTS', K) == 1 then
  return schema_error(K, 'is a hash without a version')
end

local want_slice = math.max(1, math.ceil(ttl_ms / want_n))
local slice_ms, n, head, D, W
if exists then
  slice_ms, n, head = tonumber(raw[2]), tonumber(raw[3]), tonumber(raw[4])
  D, W = tonumber(raw[5]), tonumber(raw[6])
  if not (slice_ms and n and head and D and W) or slice_ms < 1 or n < 1 or n > 100 then
    return schema_error(K, 'has corrupt budget fields')
  end
else
  slice_ms, n, head, D, W = want_slice, want_n, nil, 0, 0
end
local drift = (slice_ms ~= want_slice or n ~= want_n) and 1 or 0

local function fid(prefix, id) return prefix .. string.format('%d', id) end

-- Lazy eviction: drop the slices that left the window (at most n HDELs).
local cur = math.floor(now / slice_ms)
local changed = false
if head == nil then
  head = cur
elseif cur > head then
  if cur - head >= n then
    for id = head - n + 1, head do redis.call('HDEL', K, fid('d:', id), fid('w:', id)) end
    D, W = 0, 0
  else
    for id = head - n + 1, cur - n do
      local old = redis.call('HMGET', K, fid('d:', id), fid('w:', id))
      D = D - (tonumber(old[1]) or 0)
      W = W - (tonumber(old[2]) or 0)
      redis.call('HDEL', K, fid('d:', id), fid('w:', id))
    end
  end
  head = cur
  changed = true
end
-- cur < head (server clock stepped back): keep counting into the newest slice.

local function balance()
  return math.floor((reserve + ppm * D) / 1000000) - W
end

local ok = 1
local write = false
if amount > 0 then
  redis.call('HINCRBY', K, fid('d:', head), amount)
  D = D + amount
  write = true
end
if op == 'withdraw' then
  if balance() >= 1 then
    redis.call('HINCRBY', K, fid('w:', head), 1)
    W = W + 1
    write = true
  else
    ok = 0
  end
end

if write or (exists and changed) then
  redis.call('HSET', K, 'v', '1', 'slice_ms', slice_ms, 'n', n, 'head', string.format('%d', head),
             'D', D, 'W', W, 'ppm', string.format('%d', ppm),
             'reserve', string.format('%d', reserve))
end
if write then
  redis.call('PEXPIRE', K, (n + 1) * slice_ms)
end

return {ok, balance(), D, W, now, drift}
