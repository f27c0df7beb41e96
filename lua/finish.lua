--!module needs budget bulkhead breaker
-- distbreaker merged call: what a Policy attempt owes Redis once it ran (the retry
-- budget deposit, the bulkhead release, the breaker record) in ONE call. A module:
-- the helpers below are defined once and the chunk returns the entry. In the
-- Functions library it calls the three scripts' functions defined before it; its
-- EVAL form carries their EVAL definitions before this file (`needs`).
--
-- Each call runs exactly as if it had been sent alone, in order, with one
-- difference: TIME is read once, here, and every call sees that server time (a
-- call alone would read it a few microseconds later). A call that fails (its own
-- error reply, or an error raised inside it, e.g. a write refused by a full
-- Redis) has its error in its place; the calls after it still run, as in a
-- pipeline.
--
-- ARGV[1] plan: one "<script>:<key count>:<argument count>" per call, joined by
--         ",", e.g. "budget:1:5,bulkhead:2:5,breaker:1:10"; <script> is budget,
--         bulkhead or breaker, each at most once; each count at most 1000
-- ARGV[2...] every call's ARGV, in plan order   KEYS: every call's KEYS, in order
--         (one cluster slot: all under one name's hash tag)
-- Reply: ONE flat array (each nested array costs Redis a few thousand instructions
--         to send): for each call in plan order, the number n >= 1 of its reply's
--         elements, then those n elements (as that script documents its reply); or 0,
--         then its reply when that is not an array (an integer, or the error of a
--         call that failed).

local RUN = {budget = budget, bulkhead = bulkhead, breaker = breaker}
-- The flat reply is built in a table presized by a constructor: growing one element by
-- element rehashes it at every power of two, which costs more than filling it.
local function presized()  -- room for the hot paths' replies (13 elements); more grow it
  return {false, false, false, false, false, false, false, false,
          false, false, false, false, false, false, false, false}
end
local PLANS, PLANS_N = {}, 0   -- parsed plans (a function library keeps them)
local MAX_COUNT = 1000             -- keys or arguments of one call, at most

-- {script, key count, argument count, ...} of a plan string, with the totals of keys
-- and arguments in fields nkeys and nargs; nil when malformed.
local function parse_plan(plan)
  local parsed, seen, n = {nkeys = 0, nargs = 1}, {}, 0
  for part in string.gmatch(plan, '[^,]+') do
    local script, nk, na = string.match(part, '^(%a+):(%d+):(%d+)$')
    if not script or not RUN[script] or seen[script] then return nil end
    nk, na = tonumber(nk), tonumber(na)
    -- a call's KEYS and ARGV are copied by unpack(), which raises (outside the calls'
    -- pcall: the whole reply lost after earlier calls ran) beyond ~8000 values
    if nk > MAX_COUNT or na > MAX_COUNT then return nil end
    seen[script] = true
    parsed[n + 1], parsed[n + 2], parsed[n + 3] = script, nk, na
    parsed.nkeys, parsed.nargs = parsed.nkeys + nk, parsed.nargs + na
    n = n + 3
  end
  if n == 0 then return nil end
  return parsed
end

-- The server ms of a TIME reply. Its seconds change once a second: their text is
-- parsed only when it changed (tonumber of a string costs as much as a command's
-- argument handling).
local tonumber, type, pcall, unpack = tonumber, type, pcall, unpack
local last_s, last_s_ms = nil, 0
local function server_ms(t)
  local s, micros = t[1], tonumber(t[2])
  if s ~= last_s then last_s, last_s_ms = s, tonumber(s) * 1000 end
  return last_s_ms + (micros - micros % 1000) / 1000, micros
end

local function as_error(e)
  if type(e) == 'table' and e['err'] then return e end
  return {err = 'ERR ' .. tostring(e)}
end

return function(KEYS, ARGV)
  local plan_s = ARGV[1] or ''
  local plan = PLANS[plan_s]
  if not plan then
    plan = parse_plan(plan_s)
    if not plan then return redis.error_reply('DISTBREAKER_ARGS bad finish plan ' .. plan_s) end
    if PLANS_N >= 16 then PLANS, PLANS_N = {}, 0 end
    PLANS[plan_s], PLANS_N = plan, PLANS_N + 1
  end
  if plan.nkeys ~= #KEYS or plan.nargs ~= #ARGV then
    return redis.error_reply('DISTBREAKER_ARGS finish plan ' .. plan_s ..
                             ' does not match its KEYS and ARGV')
  end
  local now, micros = server_ms(redis.call('TIME'))
  local flat, n, ki, ai = presized(), 0, 1, 2
  for i = 1, #plan, 3 do
    local nk, na = plan[i + 1], plan[i + 2]
    local keys = nk == 1 and {KEYS[ki]} or {unpack(KEYS, ki, ki + nk - 1)}
    local ok, reply = pcall(RUN[plan[i]], keys, {unpack(ARGV, ai, ai + na - 1)}, now, micros)
    ki, ai = ki + nk, ai + na
    if not ok or (type(reply) == 'table' and reply['err']) then
      flat[n + 1], flat[n + 2], n = 0, as_error(reply), n + 2
    elseif type(reply) ~= 'table' then  -- a scalar reply (a bulkhead's hot paths)
      flat[n + 1], flat[n + 2], n = 0, reply, n + 2
    else
      local m = #reply
      flat[n + 1] = m
      for j = 1, m do flat[n + 1 + j] = reply[j] end
      n = n + 1 + m
    end
  end
  flat[n + 1] = nil  -- a reply ends at its first nil: the presized rest is not sent
  return flat
end
