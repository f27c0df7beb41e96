--!lib needs prelude breaker_config
-- The parts of the breaker's operations (lua/breaker.lua: record, acquire, set) that
-- work on values they are given: a record's counts, a `set`'s hold, the open wait,
-- the quorum of failing workers. Explicit data flow (no upvalue is shared with
-- lua/breaker.lua, which applies the answers to the call's state).
local floor, min, max, tonumber, tostring = math.floor, math.min, math.max, tonumber, tostring
local unpack = unpack
local args_error, wire_field = prelude.args_error, breaker_config.field

-- A record's ARGV[7..10] (successes, failures, slow calls, total ms) as numbers, or
-- nil and the error reply. One call's outcome, the usual record, is told by string
-- compares alone.
local function record_counts(a, b, c, d)
  local ok, fails, slows
  if c == '0' and a == '1' and b == '0' then
    ok, fails, slows = 1, 0, 0
  elseif c == '0' and a == '0' and b == '1' then
    ok, fails, slows = 0, 1, 0
  else
    ok, fails, slows = tonumber(a), tonumber(b), tonumber(c)
  end
  local ms = tonumber(d)
  if not (ok and fails and slows and ms) or ok < 0 or fails < 0 or slows < 0 or ms < 0
      or ok % 1 ~= 0 or fails % 1 ~= 0 or slows % 1 ~= 0 or ms % 1 ~= 0 then
    return nil, args_error('record counts must be integers >= 0')
  end
  if slows > ok + fails then return nil, args_error('record: more slow calls than calls') end
  return ok, fails, slows, ms
end

-- The open wait (Resilience4j's waitIntervalFunctionInOpenState): the configured
-- wait times multiplier^(consecutive opens - 1), capped (at the key TTL when no
-- cap is configured), spread by +-randomization with the server clock's
-- microseconds as the random draw; a close resets the count. `g`: the cold group.
local function wait_in_open(g, ttl_ms, micros)
  local open_wait, wait_mult, wait_rnd = g.open_wait, g.wait_mult, g.wait_rnd
  if wait_mult == 1000000 and wait_rnd == 0 then return open_wait end
  local cap = g.max_open_wait > 0 and g.max_open_wait or ttl_ms
  local w = open_wait
  if g.opens > 1 then w = open_wait * (wait_mult / 1000000) ^ min(g.opens - 1, 200) end
  if w > cap then w = cap end
  if wait_rnd > 0 then
    w = w * (1 + (wait_rnd / 1000000) * (2 * (micros % 1000) / 999 - 1))
  end
  return max(1, floor(w))
end

-- A `set`'s override end (ms), 0 for none, or nil and the error reply.
local function hold_from(now, hold_for, hold_until, target)
  if hold_for == '' and hold_until == '' then return 0 end
  if hold_for ~= '' and hold_until ~= '' then
    return nil, args_error('give a hold duration or an end, not both')
  end
  local v = tonumber(hold_for ~= '' and hold_for or hold_until)
  if not v or v ~= floor(v) then return nil, args_error('hold ms must be an integer') end
  local hold = (hold_for ~= '') and (now + v) or v
  if hold <= now then return nil, args_error('the override would end in the past') end
  if target == 'RESET' or target == 'ADOPT' or target == 'HALF_OPEN' or target == 'OPEN' then
    return nil, args_error(tostring(target) .. ' takes no end')
  end
  return hold
end

-- Whether a RESET of a CLOSED breaker changes anything (then it is recorded): a
-- window with calls, a held CLOSED, a drift record, a config adopted. A reset that
-- changes nothing records nothing.
local function reset_changes(calls, override_until, clear_drift, adopted)
  return calls > 0 or override_until > 0 or clear_drift or adopted
end

-- Quorum-gated trip: with config field 20 (min failing workers) above 1, a
-- failure-rate trip needs failures from that many distinct workers within field 21
-- ms (default 60000). A record whose ARGV[11] names its worker (`mark`) marks it in
-- the hash <state key>:fw (worker -> server ms of its last failure); marks older than
-- the window are pruned here, and the hash is deleted whenever the window is
-- cleared. The config is the one this call stores (`stored`), else the stored one
-- (meta hash), else the caller's (`wire`). A marks key of a foreign type: nil and its
-- schema error (nothing is written yet).
local function quorum_met(state_key, meta_key, stored, wire, mark, now)
  local w = stored
  if not w then
    w = redis.pcall('HGET', meta_key, 'cfg')
    -- a foreign meta key: let the trip go on, `finish` reports the key before writing
    if type(w) == 'table' then return true end
  end
  w = w or wire
  local needed = tonumber(wire_field(w, 20) or '') or 1
  if needed <= 1 then return true end
  local window = tonumber(wire_field(w, 21) or '') or 60000
  local k_fw = state_key .. ':fw'
  local marks = redis.pcall('HGETALL', k_fw)
  if marks['err'] then return nil, prelude.failed_on(k_fw, 'hash', marks) end
  local seen, stale = {}, {}
  local count = 0
  if mark then seen[mark], count = true, 1 end
  for i = 1, #marks, 2 do
    local worker, at = marks[i], tonumber(marks[i + 1]) or 0
    if now - at > window then
      stale[#stale + 1] = worker
    elseif not seen[worker] then
      seen[worker], count = true, count + 1
    end
  end
  if #stale > 0 then redis.call('HDEL', k_fw, unpack(stale)) end
  return count >= needed
end

return {record_counts = record_counts, wait_in_open = wait_in_open, hold_from = hold_from,
        quorum_met = quorum_met, reset_changes = reset_changes}
