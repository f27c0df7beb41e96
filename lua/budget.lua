--!module needs prelude record_codec
-- distbreaker retry budget (Finagle semantics). A module: the helpers below are
-- defined once (at FUNCTION LOAD, or once per EVAL) and the chunk returns the entry.
--
-- One budget per protected name, shared by the fleet. Every logical request
-- deposits once, every retry withdraws once; over the last ttl the budget is
--   balance = math.floor((reserve + percent_can_retry * deposits) / 1e6) - withdrawals
-- and a withdrawal succeeds only when balance >= 1. Integer arithmetic only:
-- the reserve and the percentage arrive in millionths, so math.floor() is exact.
--
-- KEYS[1] window string  <ns>:{<name>}:rb2  (budget layout 2; layout 1, the hash
--   <ns>:{<name>}:rb, is no longer written: docs/KEY_SCHEMA.md, "Retry budget")
--   big-endian 8-byte signed integers, a header of 10 then 3 per older slice:
--   [1] v         layout version, 2
--   [2] n         slices per window    } the window geometry, fixed by the first
--   [3] slice_ms  slice length in ms   } writer until the key expires or is deleted
--   [4] head      id of the newest slice (slice id = math.floor(server_ms / slice_ms))
--   [5] D, [6] W  running totals of deposits / withdrawals over the live slices
--   [7] d, [8] w  deposits / withdrawals in slice head
--   [9] ppm, [10] reserve  ARGV[2] and ARGV[3] of the last call that wrote the whole
--                 string (created it or started a slice; informational: operator tools
--                 show the balance with them, each call uses its own)
--   then, oldest first, each older slice still in the window that counted anything:
--   id, deposits, withdrawals (ids in (head - n, head))
--   Why this layout: a deposit within the current slice reads the header (GETRANGE)
--   and writes its four counts (SETRANGE); a deposit that starts a slice reads the
--   older slices too (one GETRANGE) and writes the whole string with its TTL (one
--   SET): no command per slice, and none that only refreshes a TTL.
--   TTL: PX (n + 1) * slice_ms by the SET of a call that creates the string or moves
--   head to a new slice (at most once per slice): a count written later in that slice
--   leaves the window (n slices after its own) before the key expires. A write within
--   the current slice (SETRANGE) keeps the TTL. A call that writes nothing (balance; a
--   refused withdrawal carrying no deposits, within the current slice) writes nothing.
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
-- Commands (no drift): within the current slice TIME, GETRANGE, SETRANGE; a call that
-- starts a slice TIME, GETRANGE, GETRANGE (the older slices), SET; creating: TIME,
-- GETRANGE, EXISTS, SET.
-- (Globals are looked up per call: while a library loads, Redis hides them.)


local schema_error, failed_on, args_error = prelude.schema_error, prelude.failed_on,
                                           prelude.args_error
-- (Globals as locals: each global lookup and each tonumber() of a string costs; the
-- chunk runs at the first call, when the globals are there.)
local floor, tonumber, type, rcall, rpcall = math.floor, tonumber, type, redis.call,
                                            redis.pcall
local sub = string.sub
local packer, encode, decode, decode_fields = record_codec.packer, record_codec.encode,
                                              record_codec.decode, record_codec.decode_fields

local HEADER_FIELDS = 10              -- 8-byte integers in the header
local HEADER_BYTES = 8 * HEADER_FIELDS
local HEADER_FORMAT = '>' .. string.rep('i8', HEADER_FIELDS)
local HOT_FORMAT = '>' .. string.rep('i8', 8)  -- the header's fields before ppm, reserve
local COUNTS_FORMAT = '>i8i8i8i8'
local HEADER_FIRST, HEADER_LAST = '0', tostring(HEADER_BYTES - 1)
local OLDER_FIRST = tostring(HEADER_BYTES)
local COUNTS_AT = '32'                -- byte offset of D, W, d, w (fields 5-8)
local ENTRY_BYTES = 24                -- an older slice: id, deposits, withdrawals
local VERSION = 2

-- A failed first read of K: name the foreign type (TYPE runs only here), or pass
-- the error on (an ACL refusal on a key of the right type).
local function read_failed(key, reply) return failed_on(key, 'string', reply) end

-- Counts and ids the script keeps exact: integers in [0, 2^53). (A field read from
-- the window is an integer: its 8 bytes are one; only its range needs a check.)
local BIG = 9007199254740992
local function exact(x)
  return x ~= nil and x >= 0 and x < BIG
end

local function corrupt(K) return schema_error(K, 'has corrupt budget fields') end

local function bad_args(op)
  return args_error('bad budget arguments for ' .. tostring(op))
end

-- D, W, d, w as the 32 bytes SETRANGE writes at COUNTS_AT.
local function counts_bytes(D, W, d, w)  -- (without struct: fakeredis)
  return encode({D, W, d, w}, 1, 4, 8)
end

-- ARGV[2..5] as {ppm, reserve, ttl ms, slices, slice ms, TTL ms as text}, false when
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
    if ppm and ppm >= 0 and ppm < BIG and ppm == math.floor(ppm) and reserve
        and reserve >= 0 and reserve < BIG and reserve == math.floor(reserve) and ttl_ms
        and ttl_ms >= 1 and n and n >= 1 and n <= 100 and n == math.floor(n) then
      local slice = math.ceil(ttl_ms / n)
      if slice < 1 then slice = 1 end
      parsed = {ppm, reserve, ttl_ms, n, slice, string.format('%d', (n + 1) * slice)}
    end
    if GEOMETRY_N >= 64 then GEOMETRY, GEOMETRY_N, t2, t3, t4 = {}, 0, nil, nil, nil end
    if not t2 then t2 = {}; GEOMETRY[a2] = t2 end
    if not t3 then t3 = {}; t2[a3] = t3 end
    if not t4 then t4 = {}; t3[a4] = t4 end
    t4[a5], GEOMETRY_N = parsed, GEOMETRY_N + 1
  end
  return parsed
end

-- The older slice at byte `pos` of `older`: id, deposits, withdrawals.
local function entry_at(older, pos)
  if packer then
    local id, d, w = packer.unpack('>i8i8i8', older, pos)
    return id, d, w
  end
  local e = decode(older, 3, 8, pos)
  return e[1], e[2], e[3]
end

-- The older slices after head moves to `cur` (> head): the ones that left the window
-- (ids <= cur - n) go, their counts out of D and W; the old head slice joins them when
-- it stays and counted anything. Answers the new tail, D, W; nil when the tail is
-- corrupt (nothing written yet).
local function roll(older, head, cur, n, D, W, dh, wh)
  if cur - head >= n then return '', 0, 0 end  -- the whole window left (not read)
  local len = #older
  if len % ENTRY_BYTES ~= 0 then return nil end
  local last_gone, pos = cur - n, 1
  while pos <= len do
    local id, d, w = entry_at(older, pos)
    if not (exact(id) and exact(d) and exact(w)) or id >= head then return nil end
    if id > last_gone then break end
    D, W, pos = D - d, W - w, pos + ENTRY_BYTES
  end
  if pos > 1 then older = sub(older, pos) end
  if dh > 0 or wh > 0 then
    older = older .. (packer and packer.pack('>i8i8i8', head, dh, wh)
                      or encode({head, dh, wh}, 1, 3, 8))
  end
  return older, D, W
end

return function(KEYS, ARGV, given_now)
  local K, op = KEYS[1], ARGV[1]
  local g = parse_geometry(ARGV[2], ARGV[3], ARGV[4], ARGV[5])
  local amount, withdraw
  local deposit = op == 'deposit' or op == 'add'
  if deposit then
    local a6 = ARGV[6]
    amount = (a6 == nil or a6 == '1') and 1 or tonumber(a6)
    if amount and amount < 1 then amount = nil end
  elseif op == 'withdraw' or op == 'balance' then
    withdraw = op == 'withdraw'
    amount = tonumber(ARGV[7] or '0')
  end
  if not amount or amount < 0 or amount ~= floor(amount) or not g then
    return bad_args(op)
  end

  local now = given_now  -- a merged call (lua/finish.lua) read TIME once for all its calls
  if not now then
    local t = rcall('TIME')
    now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
  end

  -- One read: the header.
  local raw = rpcall('GETRANGE', K, HEADER_FIRST, HEADER_LAST)
  if type(raw) == 'table' then return read_failed(K, raw) end
  local exists = raw ~= ''
  local n, slice_ms, head, D, W, dh, wh
  if exists then
    if #raw ~= HEADER_BYTES then return corrupt(K) end
    local v
    if packer then
      v, n, slice_ms, head, D, W, dh, wh = packer.unpack(HOT_FORMAT, raw)
    else
      v, n, slice_ms, head, D, W, dh, wh = decode_fields(raw, 8)
    end
    if v ~= VERSION then
      return schema_error(K, 'has budget layout ' .. tostring(v) .. ', this client speaks 2')
    end
    if not (n >= 1 and n <= 100 and slice_ms >= 1 and slice_ms < BIG and head >= 0
            and head < BIG and D >= 0 and D < BIG and W >= 0 and W < BIG and dh >= 0
            and dh < BIG and wh >= 0 and wh < BIG) then
      return corrupt(K)
    end
  else
    if rcall('EXISTS', K) == 1 then return schema_error(K, 'is an empty string') end
    n, slice_ms, D, W, dh, wh = g[4], g[5], 0, 0, 0, 0
  end
  local drift = 0
  if slice_ms ~= g[5] or n ~= g[4] then drift = 1 end
  local cur = floor(now / slice_ms)
  if not head then head = cur end

  -- Lazy eviction: a new slice drops the older slices that left the window.
  local older, moved = nil, false
  if cur > head then
    if cur - head < n then older = rcall('GETRANGE', K, OLDER_FIRST, '-1') end
    older, D, W = roll(older, head, cur, n, D, W, dh, wh)
    if not older or not (exact(D) and exact(W)) then return corrupt(K) end
    head, dh, wh, moved = cur, 0, 0, true
  end  -- (cur < head: the server clock stepped back; counts go into head)

  local ok, wrote = 1, false
  if amount > 0 then
    D, dh, wrote = D + amount, dh + amount, true
  end
  if withdraw then
    if floor((g[2] + g[1] * D) / 1000000) - W >= 1 then
      W, wh, wrote = W + 1, wh + 1, true
    else
      ok = 0
    end
  end
  if not (D < BIG and dh < BIG) then return corrupt(K) end  -- (nothing written yet)

  if moved or (wrote and not exists) then
    -- created or a new slice: the whole string, with its TTL
    local ttl = g[6]
    if drift == 1 then ttl = string.format('%d', (n + 1) * slice_ms) end
    local header
    if packer then
      header = packer.pack(HEADER_FORMAT, VERSION, n, slice_ms, head, D, W, dh, wh, g[1], g[2])
    else
      header = encode({VERSION, n, slice_ms, head, D, W, dh, wh, g[1], g[2]}, 1, HEADER_FIELDS, 8)
    end
    rcall('SET', K, older and header .. older or header, 'PX', ttl)
  elseif wrote then
    rcall('SETRANGE', K, COUNTS_AT, packer and packer.pack(COUNTS_FORMAT, D, W, dh, wh)
                                    or counts_bytes(D, W, dh, wh))
  end

  if op == 'add' then return drift end
  return {ok, floor((g[2] + g[1] * D) / 1000000) - W, D, W, now, drift}
end
