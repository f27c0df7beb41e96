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
-- distbreaker retry budget (Finagle semantics). A module: the helpers below are
-- defined once (at FUNCTION LOAD, or once per EVAL) and the chunk returns the entry.
--
-- One budget per protected name, shared by the fleet. Every logical request
-- deposits once, every retry withdraws once; over the last ttl the budget is
--   balance = math.floor((reserve + percent_can_retry * deposits) / 1e6) - withdrawals
-- and a withdrawal succeeds only when balance >= 1. Integer arithmetic only:
-- the reserve and the percentage arrive in millionths, so math.floor() is exact.
--
-- KEYS[1] slices hash  <ns>:{<name>}:rb
--   v           layout version, "1"
--   slice_ms    slice length in ms   } the window geometry, fixed by the first
--   n           slices per window    } writer until the key expires or is deleted
--   head        id of the newest slice (slice id = math.floor(server_ms / slice_ms))
--   D, W        running totals of deposits / withdrawals over the live slices
--   d:<id>      deposits in slice <id>      (only the last n slices exist:
--   w:<id>      withdrawals in slice <id>    older ones are evicted lazily)
--   ppm, reserve  ARGV[2] and ARGV[3] of the last call that wrote the whole header
--                 (created the hash or started a slice; informational: lets
--                 operator tools show the balance; each call uses its own)
--   TTL: PEXPIRE (n + 1) * slice_ms by a call that writes and either creates the
--   hash or moves head to a new slice (at most once per slice): a count written
--   later in that slice leaves the window (n slices after its own) before the
--   key expires. A call that writes nothing (balance; a refused withdrawal
--   carrying no deposits, within the current slice) refreshes nothing.
--
-- ARGV[1] op: deposit | add | withdraw | balance (add: a deposit whose caller needs
--         only the drift flag, e.g. a Policy's merged call: it answers the integer drift)
-- ARGV[2] percent_can_retry in millionths (0.2 -> 200000)
-- ARGV[3] reserve = min_retries_per_sec * ttl in millionths (10/s, 10 s -> 100000000)
-- ARGV[4] ttl in ms (>= 1)   ARGV[5] slices per ttl (1-100)
-- ARGV[6] deposit: deposits to add (integer >= 1, default 1); withdraw and
--         balance ignore it (clients send 1)
-- ARGV[7] withdraw and balance only, optional: deposits to add first (integer
--         >= 0, default 0), so a client can carry its batched deposits into its
--         next call; deposit ignores it
--
-- Reply: {ok, balance, deposits, withdrawals, now_ms, drift}
--   ok: 1 (deposit, balance: always; withdraw: 1 if taken, 0 if exhausted)
--   balance: the balance after the operation (may be negative after drift)
--   deposits, withdrawals: D and W over the live window
--   drift: 1 when the stored geometry differs from ARGV[4]/ARGV[5] (stored wins)
-- Errors: "DISTBREAKER_SCHEMA <key> ..." (foreign data), "DISTBREAKER_ARGS ...".
-- Commands on the hot path (same slice, no drift): TIME, HMGET, HSET; a deposit that
-- starts a slice: TIME, HMGET, HMGET (the slices that left), HDEL, HSET, PEXPIRE.
-- (Globals are looked up per call: while a library loads, Redis hides them.)


local schema_error, failed_on, args_error = prelude.schema_error, prelude.failed_on,
                                           prelude.args_error

-- A failed first read of K: name the foreign type (TYPE runs only here), or pass
-- the error on (an ACL refusal on a key of the right type).
local function read_failed(key, reply) return failed_on(key, 'hash', reply) end

-- Counts and ids the script keeps exact (and prints with %d): integers below 2^53. A
-- field such as D = "1.5e400" (tonumber: inf) is foreign data, not a huge count.
local BIG = 9007199254740992
local function exact(x)
  return x ~= nil and x == math.floor(x) and x > -BIG and x < BIG
end

local function bad_args(op)
  return args_error('bad budget arguments for ' .. tostring(op))
end

-- ARGV[2..5] as {ppm, reserve, ttl ms, slices, slice ms, slice ms as text}, false when
-- malformed; parsed once per distinct string (a function library keeps them).
-- (Looked up by the four strings in turn: cheaper than a key made by concatenation.)
local GEOMETRY, GEOMETRY_N = {}, 0
local function parse_geometry(a2, a3, a4, a5)
  a2, a3, a4, a5 = a2 or '', a3 or '', a4 or '', a5 or ''
  local t2 = GEOMETRY[a2]
  local t3 = t2 and t2[a3]
  local t4 = t3 and t3[a4]
  local parsed = t4 and t4[a5]
  if parsed == nil then
    local ppm, reserve, ttl_ms, n = tonumber(a2), tonumber(a3), tonumber(a4), tonumber(a5)
    parsed = false
    if ppm and ppm >= 0 and reserve and reserve >= 0 and ttl_ms and ttl_ms >= 1 and n
        and n >= 1 and n <= 100 then
      local slice = math.ceil(ttl_ms / n)
      if slice < 1 then slice = 1 end
      parsed = {ppm, reserve, ttl_ms, n, slice, string.format('%d', slice), string.format('%d', n)}
    end
    if GEOMETRY_N >= 64 then GEOMETRY, GEOMETRY_N, t2, t3, t4 = {}, 0, nil, nil, nil end
    if not t2 then t2 = {}; GEOMETRY[a2] = t2 end
    if not t3 then t3 = {}; t2[a3] = t3 end
    if not t4 then t4 = {}; t3[a4] = t4 end
    t4[a5], GEOMETRY_N = parsed, GEOMETRY_N + 1
  end
  return parsed
end

-- The slices that leave the window when the newest moves from slice `head` to `cur`
-- (> head): their fields that exist (for one HDEL; nil: none) and the totals less
-- their counts. O(1) commands at any gap (a loop of HMGET + HDEL per slice cost 2
-- commands per slice that passed). After a gap of one or two slices (calls every
-- second or so) one HMGET of their fields; after a longer one, when most of those
-- seconds had no call, one HGETALL: it answers only the fields that exist, and
-- building an id's text costs more than reading a field.
local function leaving(K, head, cur, n, D, W)
  local fields, k = {}, 0
  local first, last = head - n + 1, cur - n
  if cur - head > 2 then
    local all = redis.call('HGETALL', K)
    local whole = cur - head >= n
    for i = 1, #all, 2 do
      local f = all[i]
      local kind = string.sub(f, 1, 2)
      if kind == 'd:' or kind == 'w:' then
        local id = tonumber(string.sub(f, 3))
        if id and (whole or (id >= first and id <= last)) then
          fields[k + 1], k = f, k + 1
          if not whole then
            if kind == 'd:' then D = D - (tonumber(all[i + 1]) or 0)
            else W = W - (tonumber(all[i + 1]) or 0) end
          end
        end
      end
    end
    if whole then D, W = 0, 0 end
    if k == 0 then fields = nil end
    return fields, D, W
  end
  for id = first, last do
    fields[k + 1], fields[k + 2], k = 'd:' .. id, 'w:' .. id, k + 2
  end
  local old = redis.call('HMGET', K, unpack(fields))
  for i = 1, k, 2 do
    D, W = D - (tonumber(old[i]) or 0), W - (tonumber(old[i + 1]) or 0)
  end
  return fields, D, W
end

-- The hot path: a deposit within the current slice of a hash whose geometry matches
-- (compared as the text the general path writes); the general path's result with no
-- eviction to do. nil: not that case (nothing written), the general path decides.
local last_slice, last_cs, last_dk = nil, nil, nil  -- the current slice's texts (kept)
local function fast_deposit(K, g, amount, now, quiet)
  local cur = math.floor(now / g[5])
  local cs, dk = last_cs, last_dk
  if cur ~= last_slice then
    cs = string.format('%d', cur)
    dk = 'd:' .. cs
    last_slice, last_cs, last_dk = cur, cs, dk
  end
  local raw = redis.pcall('HMGET', K, 'v', 'slice_ms', 'n', 'head', 'D', dk, 'W')
  if raw['err'] or raw[1] ~= '1' or raw[2] ~= g[6] or raw[3] ~= g[7] then
    return nil
  end
  local D, dh, W = tonumber(raw[5]), tonumber(raw[6] or 0), tonumber(raw[7])
  -- The hot path's share of `exact`: counts below 2^53 (inf and nan fail the comparison);
  -- else the general path checks them and says why.
  if not (D and W and dh) then return nil end
  local sum = D + W + dh
  if not (sum < BIG and sum > -BIG) then return nil end
  if raw[4] ~= cs then
    -- a new slice (the usual deposit after a second or more): the slices that left
    -- go, and the whole header is written with the TTL, as the general path does
    local head = tonumber(raw[4])
    if not exact(head) or head >= cur or raw[6] then return nil end
    local gone
    gone, D, W = leaving(K, head, cur, g[4], D, W)
    if not (exact(D) and exact(W)) then return nil end  -- (nothing written yet)
    D = D + amount
    if gone then redis.call('HDEL', K, unpack(gone)) end
    redis.call('HSET', K, 'head', cs, 'D', string.format('%d', D), 'W', string.format('%d', W),
               'ppm', string.format('%d', g[1]), 'reserve', string.format('%d', g[2]),
               dk, string.format('%d', amount))
    redis.call('PEXPIRE', K, (g[4] + 1) * g[5])
  else
    D, dh = D + amount, dh + amount
    redis.call('HSET', K, 'D', string.format('%d', D), dk, string.format('%d', dh))
  end
  if quiet then return 0 end
  return {1, math.floor((g[2] + g[1] * D) / 1000000) - W, D, W, now, 0}
end

return function(KEYS, ARGV, given_now)
  local K, op = KEYS[1], ARGV[1]
  local g = parse_geometry(ARGV[2], ARGV[3], ARGV[4], ARGV[5])
  local ppm, reserve, ttl_ms, want_n = nil, nil, nil, nil
  if g then ppm, reserve, ttl_ms, want_n = g[1], g[2], g[3], g[4] end
  local amount, withdraw
  local deposit = op == 'deposit' or op == 'add'
  if deposit then
    amount = ARGV[6] == '1' and 1 or tonumber(ARGV[6] or '1')
    if amount and amount < 1 then amount = nil end
  elseif op == 'withdraw' or op == 'balance' then
    withdraw = op == 'withdraw'
    amount = tonumber(ARGV[7] or '0')
  end
  if not amount or amount < 0 or amount ~= math.floor(amount) or not g then
    return bad_args(op)
  end

  local now = given_now  -- a merged call (lua/finish.lua) read TIME once for all its calls
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  if deposit then
    local fast = fast_deposit(K, g, amount, now, op == 'add')
    if fast then return fast end
  end
  local want_slice = g[5]
  local cur = math.floor(now / want_slice)

  -- One read: the header and, when the geometry matches, the current slice.
  local cs = cur .. ''
  local raw = redis.pcall('HMGET', K, 'v', 'slice_ms', 'n', 'head', 'D', 'W', 'd:' .. cs,
                          'w:' .. cs)
  if raw['err'] then return read_failed(K, raw) end
  local exists = raw[1] ~= false
  local slice_ms, n, head, D, W, dh, wh
  if exists then
    if raw[1] ~= '1' then
      return schema_error(K, 'has schema version ' .. tostring(raw[1]) .. ', this client speaks 1')
    end
    slice_ms, n, head = tonumber(raw[2]), tonumber(raw[3]), tonumber(raw[4])
    D, W = tonumber(raw[5]), tonumber(raw[6])
    if not (exact(slice_ms) and exact(n) and exact(head) and exact(D) and exact(W))
        or slice_ms < 1 or n < 1 or n > 100 then
      return schema_error(K, 'has corrupt budget fields')
    end
  else
    if redis.call('EXISTS', K) == 1 then return schema_error(K, 'is a hash without a version') end
    slice_ms, n, head, D, W = want_slice, want_n, nil, 0, 0
  end
  local drift = 0
  if slice_ms ~= want_slice or n ~= want_n then
    drift = 1
    cur = math.floor(now / slice_ms)
  end

  -- Lazy eviction: drop the slices that left the window (at most n of them).
  local moved = false
  if head == nil then
    head, dh, wh = cur, 0, 0
  elseif cur > head then
    local gone
    gone, D, W = leaving(K, head, cur, n, D, W)
    if gone then redis.call('HDEL', K, unpack(gone)) end
    head, dh, wh, moved = cur, 0, 0, true
  elseif cur == head and drift == 0 then
    dh, wh = tonumber(raw[7]) or 0, tonumber(raw[8]) or 0
  else  -- drift, or the server clock stepped back: count into the newest slice
    local got = redis.call('HMGET', K, 'd:' .. head, 'w:' .. head)
    dh, wh = tonumber(got[1]) or 0, tonumber(got[2]) or 0
  end
  if not (exact(D) and exact(W) and exact(dh) and exact(wh)) then
    return schema_error(K, 'has corrupt budget fields')  -- (only dead slices were dropped)
  end

  local ok, wrote_d, wrote_w = 1, false, false
  if amount > 0 then
    D, dh, wrote_d = D + amount, dh + amount, true
  end
  if withdraw then
    if math.floor((reserve + ppm * D) / 1000000) - W >= 1 then
      W, wh, wrote_w = W + 1, wh + 1, true
    else
      ok = 0
    end
  end

  local write = wrote_d or wrote_w
  if write and exists and not moved then
    -- the hot path: one HSET of the counters that changed
    local hs = head == cur and cs or string.format('%d', head)
    if wrote_d and wrote_w then
      redis.call('HSET', K, 'D', D, 'd:' .. hs, dh, 'W', W, 'w:' .. hs, wh)
    elseif wrote_d then
      redis.call('HSET', K, 'D', D, 'd:' .. hs, dh)
    else
      redis.call('HSET', K, 'W', W, 'w:' .. hs, wh)
    end
  elseif write or moved then
    -- created or a new slice: the whole header, and the TTL
    local args = {'v', '1', 'slice_ms', slice_ms, 'n', n, 'head', string.format('%d', head), 'D', D,
                  'W', W, 'ppm', string.format('%d', ppm), 'reserve', string.format('%d', reserve)}
    if wrote_d then args[#args + 1] = 'd:' .. head; args[#args + 1] = dh end
    if wrote_w then args[#args + 1] = 'w:' .. head; args[#args + 1] = wh end
    redis.call('HSET', K, unpack(args))
    redis.call('PEXPIRE', K, (n + 1) * slice_ms)
  end

  if op == 'add' then return drift end
  return {ok, math.floor((reserve + ppm * D) / 1000000) - W, D, W, now, drift}
end

end)(prelude())
return main(KEYS, ARGV)
