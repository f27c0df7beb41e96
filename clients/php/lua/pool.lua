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
-- distbreaker fleet-wide pool: one health record per member, Envoy's outlier detection
-- decided by this one script for the whole fleet (so max_ejection_percent is enforced
-- atomically: two workers can never both take the last ejection slot), and the choice
-- of a member (power of two choices on fleet-wide in-flight counts or latency).
-- A module: helpers defined once (at FUNCTION LOAD, or once per EVAL), the chunk
-- returns the entry. docs/KEY_SCHEMA.md ("Pool") is the contract; this header sums it up.
--
-- KEYS[1] <ns>:{<pool>}:pool         hash
--   v           layout version "1"
--   iv          start of the current outlier-detection interval (server ms)
--   x           server ms of the last PEXPIRE of the three keys
--   cfg         the config wire string of the call that last closed an interval
--   lt          the pool's latency threshold (ms) during this interval (0: none yet)
--   m:<member>  the member's record: 22 integers separated by one space (REC below)
--   i:<member>  the member's fleet-wide in-flight count (picks with a lease not yet
--               recorded; expired leases are reaped when an interval closes); absent: 0
-- KEYS[2] <ns>:{<pool>}:pool:leases  zset: "<token> <member>" -> lease deadline (server ms)
-- KEYS[3] <ns>:{<pool>}:pool:events  stream: member, event, why, until, actor, at (server ms
--                                     of the decision; MAXLEN ~1000)
-- TTL: all three PEXPIREd to the config's key ttl by a write when the last refresh (x)
-- is a quarter of it old.
--
-- ARGV[1] op: pick | record | repick | members | eject | uneject | exempt | status
-- ARGV[2] the config wire string (CFG below; status accepts '')
-- pick:    ARGV[3] lease token ('' = no in-flight tracking)  ARGV[4] random integer
--          ARGV[5] random integer  ARGV[6] stickiness key ('' none)
--          ARGV[7] members to avoid, space-separated ('' none)
--   reply {member, mode, now_ms}: mode 0 normal, 1 panic (too few healthy: all members
--   were candidates), 2 a probe of a member back from ejection; {'', -1, now_ms}: no
--   members.
-- record:  ARGV[3] member  ARGV[4] lease token ('')  ARGV[5] outcome s|e|g|l|n (success,
--          5xx, gateway failure 502/503/504, local-origin failure; n: none, the call was
--          abandoned: only its lease is released)  ARGV[6] duration ms
--          (-1: none)  ARGV[7] eject for ms (0: no; a 429's Retry-After)
--   reply {state, until_ms, why, event, now_ms}: the member after the call; event '' or
--   what this call did to it (ejected, capped, probing, recovered); state -1: no such
--   member (the lease is released all the same).
-- repick:  ARGV[3..7] as pick's, ARGV[8..12] as record's 3..7: records the last attempt,
--          then picks another member (the recorded one avoided unless nothing else is
--          left). reply {member, mode, now_ms, state, until_ms, why, event}
-- members: ARGV[3] mode replace | init (only when the pool has no member) | add | remove
--          ARGV[4..] member, weight pairs (remove: members only)
--   reply {members now, changed}
-- eject:   ARGV[3] member  ARGV[4] duration ms (0: until uneject)  ARGV[5] actor
-- uneject: ARGV[3] member  ARGV[4] actor
-- exempt:  ARGV[3] member  ARGV[4] duration ms (0: until uneject)  ARGV[5] actor: never
--          ejected by the rules meanwhile (a healthy member's UNTIL holds the end)
--   reply {state, until_ms, why, event, now_ms} as record
-- status:  reply {now_ms, iv, cfg, lt, n, then per member: name, record, in-flight}
--
-- Errors: "DISTBREAKER_SCHEMA <key> ..." (foreign data), "DISTBREAKER_ARGS ...".

local schema_error, failed_on, args_error = prelude.schema_error, prelude.failed_on,
                                           prelude.args_error

-- REC: the member record's fields, by position. The first five are all a pick reads (it
-- matches them alone, not the whole record).
local ST, UNTIL, W, PR, EW = 1, 2, 3, 4, 5
local MULT, C5, CG, CL, OK, BAD, MS, NL = 6, 7, 8, 9, 10, 11, 12, 13
local POK, PBAD, PMS, PNL, OVR, WHY, AT, TOT = 14, 15, 16, 17, 18, 19, 20, 21
local CAPPED = 22  -- 1 from a refusal by the cap until its next ejection or success
local SLOW, PSLOW = 23, 24  -- calls slower than the pool's latency threshold (lt), this
                            -- interval and the last
local NREC = 24
local REC_PATTERN = '^' .. string.rep('(%d+) ', NREC - 1) .. '(%d+)$'
-- states and overrides
local HEALTHY, EJECTED, PROBING = 0, 1, 2
local FORCED, EXEMPT = 1, 2
-- why a member was ejected
local WHY_5XX, WHY_GW, WHY_LOCAL, WHY_SR, WHY_FP, WHY_LAT, WHY_RA, WHY_OP, WHY_PROBE =
  1, 2, 3, 4, 5, 6, 7, 8, 9
local FOREVER = 3153600000000  -- 100 years, ms: an operator's ejection without an end

-- CFG: the config wire string's integers, by position.
local C_IV, C_BASE, C_MAX, C_PCT, C_N5, C_NG, C_NL, C_E5, C_EG, C_EL, C_SPLIT = 1, 2, 3, 4, 5, 6, 7,
  8, 9, 10, 11
local C_SRH, C_SRV, C_SRF, C_SRE, C_FPT, C_FPH, C_FPV, C_FPE = 12, 13, 14, 15, 16, 17, 18, 19
local C_LF, C_LH, C_LV, C_LE, C_PANIC, C_PROBES, C_LEASE, C_TTL, C_BAL, C_LMIN = 20, 21, 22, 23,
  24, 25, 26, 27, 28, 29
local C_LPCT = 30
local NCFG = 30

local function fmt(n) return string.format('%d', n) end

local PARSED, PARSED_N = {}, 0
local function parse_cfg(s)
  local c = PARSED[s]
  if c == nil then
    c = {}
    for x in string.gmatch(s or '', '[^,]+') do
      local n = tonumber(x)
      if not n or n < 0 or n ~= math.floor(n) then c = false; break end
      c[#c + 1] = n
    end
    if c and (#c ~= NCFG or c[C_IV] < 1 or c[C_TTL] < 1 or c[C_LEASE] < 1) then c = false end
    if PARSED_N >= 32 then PARSED, PARSED_N = {}, 0 end
    PARSED[s], PARSED_N = c, PARSED_N + 1
  end
  return c
end

-- one match for the whole record (cheaper than an iterator per field)
local function decode(s)
  local r = {string.match(s, REC_PATTERN)}
  if r[NREC] == nil then return nil end
  for j = 1, NREC do r[j] = r[j] + 0 end  -- coerced: no call per field
  return r
end

-- The record's first four fields (ST UNTIL W PR) have a fixed width, so a pick finds
-- them as one 32-character prefix, the same string while they do not change: parsed once
-- and kept (PICK_VIEWS) in the function library between calls. The other fields are
-- integers below 1e14: Lua prints them as such (no format call per field).
local PREFIX_LEN = 32
local function encode(r)
  local head = string.format('%d %013d %07d %07d ', r[ST], r[UNTIL], r[W], r[PR])
  return head .. table.concat(r, ' ', EW)
end

local PICK_VIEWS, PICK_VIEWS_N = {}, 0
-- {ST, UNTIL, W, PR} of a record's prefix (nil when it is not one)
local function pick_view(head)
  local view = PICK_VIEWS[head]
  if view == nil then
    local st, untl, w, pr = string.match(head, '^(%d+) (%d+) (%d+) (%d+) ')
    if not pr then return nil end
    view = {st + 0, untl + 0, w + 0, pr + 0}
    if PICK_VIEWS_N >= 4096 then PICK_VIEWS, PICK_VIEWS_N = {}, 0 end
    PICK_VIEWS[head], PICK_VIEWS_N = view, PICK_VIEWS_N + 1
  end
  return view
end

local function fresh(weight)
  local r = {}
  for j = 1, NREC do r[j] = 0 end
  r[W] = weight
  return r
end

-- the member's state now: an ejection whose time ended is a probation (written lazily)
local function state_of(r, now)
  if r[ST] == EJECTED and r[UNTIL] <= now then return PROBING end
  return r[ST]
end

-- an operator's exemption in force (a healthy member's UNTIL is its end, 0: none)
local function exempt_now(r, now)
  return r[OVR] == EXEMPT and (r[UNTIL] == 0 or r[UNTIL] > now)
end

-- Every member of the pool: {names (sorted), recs, infl, fields}; nil, error on foreign data.
local function load_all(K)
  local raw = redis.pcall('HGETALL', K)
  if raw['err'] then return nil, failed_on(K, 'hash', raw) end
  local names, recs, infl, f = {}, {}, {}, {}
  for j = 1, #raw, 2 do
    local k, val = raw[j], raw[j + 1]
    local p = string.sub(k, 1, 2)
    if p == 'm:' then
      local name = string.sub(k, 3)
      local r = decode(val)
      if not r then return nil, schema_error(K, 'has a corrupt member record ' .. name) end
      names[#names + 1] = name
      recs[name] = r
    elseif p == 'i:' then
      infl[string.sub(k, 3)] = tonumber(val) or 0
    else
      f[k] = val
    end
  end
  if #raw > 0 and f['v'] ~= '1' then
    return nil, schema_error(K, 'has layout version ' .. tostring(f['v']) .. ', this client speaks 1')
  end
  table.sort(names)
  return {names = names, recs = recs, infl = infl, f = f}
end

local function n_ejected(P, now, except)
  local n = 0
  for _, name in ipairs(P.names) do
    local r = P.recs[name]
    if r ~= except and state_of(r, now) == EJECTED then n = n + 1 end
  end
  return n
end

-- How many members may be ejected at once: max_ejection_percent of the pool, and at
-- least one (Envoy: "will eject at least one host regardless of the value").
local function allowed(c, total)
  local a = math.floor(total * c[C_PCT] / 100)
  if a < 1 then a = 1 end
  return a
end

-- Envoy's enforcing_* percentages: a roll of the server time's microseconds.
local function enforced(pct, roll)
  return pct >= 100 or (pct > 0 and roll % 100 < pct)
end

-- Eject member r (room already checked): the time grows with the number of ejections
-- (a Retry-After's is the time it asks, and does not grow the next one).
local function eject(r, c, why, now, for_ms)
  local d = for_ms
  if not d then
    r[MULT] = r[MULT] + 1
    d = c[C_BASE] * r[MULT]
    local cap = c[C_MAX] > c[C_BASE] and c[C_MAX] or c[C_BASE]
    if d > cap then d = cap end
  end
  r[ST], r[UNTIL], r[WHY], r[AT], r[TOT], r[PR] = EJECTED, now + d, why, now, r[TOT] + 1, 0
  r[C5], r[CG], r[CL], r[CAPPED] = 0, 0, 0, 0
end

-- No room to eject member r: it stays in (a probing one goes back to the rotation, its
-- probes' priority ended), its counters keep counting so its next failure tries again;
-- true the first time (the history gets one `capped` per refusal spell)
local function refuse(r, why)
  if r[ST] ~= EJECTED then r[ST], r[PR] = HEALTHY, 0 end
  r[WHY] = why
  if r[CAPPED] == 1 then return false end
  r[CAPPED] = 1
  return true
end

local function event(out, name, what, r, actor)
  out[#out + 1] = {name, what, r[WHY], r[UNTIL], actor or ''}
end

-- the median of field k of `items`
local function median_of(items, k)
  local sorted = {}
  for j, it in ipairs(items) do sorted[j] = it[k] end
  table.sort(sorted)
  local m = #sorted
  if m % 2 == 1 then return sorted[(m + 1) / 2] end
  return (sorted[m / 2] + sorted[m / 2 + 1]) / 2
end

-- Close the interval: ejections that ended become probations, then success rate,
-- failure percentage and latency outliers over the interval's counts (worst first, within
-- the cap), multipliers of members healthy for an interval decay, counts move to prev.
local function close_interval(P, c, now, roll, events)
  local names, recs = P.names, P.recs
  local iv = tonumber(P.f['iv'] or '') or 0
  for _, name in ipairs(names) do
    local r = recs[name]
    if r[ST] == EJECTED and r[UNTIL] <= now then
      r[ST], r[PR] = PROBING, 0
      if r[OVR] == FORCED then r[OVR] = 0 end
      event(events, name, 'probing', r)
    end
  end
  local total, room = #names, allowed(c, #names) - n_ejected(P, now)
  local function try(list, why, enforce)
    table.sort(list, function(a, b) return a[2] < b[2] or (a[2] == b[2] and a[1] < b[1]) end)
    for _, item in ipairs(list) do
      local r = recs[item[1]]
      if r[ST] ~= EJECTED and not exempt_now(r, now) and enforced(enforce, roll) then
        if room > 0 then
          eject(r, c, why, now)
          room = room - 1
          event(events, item[1], 'ejected', r)
        elseif refuse(r, why) then
          event(events, item[1], 'capped', r)
        end
      end
    end
  end
  -- success rate: mean - stdev x factor over members with enough volume
  if c[C_SRE] > 0 and total >= c[C_SRH] then
    local cand, sum = {}, 0
    for _, name in ipairs(names) do
      local r = recs[name]
      local vol = r[OK] + r[BAD]
      if r[ST] ~= EJECTED and vol >= c[C_SRV] and vol > 0 then
        local sr = 100 * r[OK] / vol
        cand[#cand + 1] = {name, sr}
        sum = sum + sr
      end
    end
    if #cand >= c[C_SRH] and #cand > 0 then
      local mean, var = sum / #cand, 0
      for _, it in ipairs(cand) do var = var + (it[2] - mean) ^ 2 end
      local limit = mean - (c[C_SRF] / 1000) * math.sqrt(var / #cand)
      local low = {}
      for _, it in ipairs(cand) do if it[2] < limit then low[#low + 1] = it end end
      try(low, WHY_SR, c[C_SRE])
    end
  end
  -- failure percentage: at or above the threshold, over members with enough volume
  if c[C_FPE] > 0 then
    local cand, bad = 0, {}
    for _, name in ipairs(names) do
      local r = recs[name]
      local vol = r[OK] + r[BAD]
      if r[ST] ~= EJECTED and vol >= c[C_FPV] and vol > 0 then
        cand = cand + 1
        local fp = 100 * r[BAD] / vol
        if fp >= c[C_FPT] then bad[#bad + 1] = {name, -fp} end
      end
    end
    if cand >= c[C_FPH] then try(bad, WHY_FP, c[C_FPE]) end
  end
  -- latency. The pool's threshold lt (ms) = factor x the median member's mean latency of
  -- the last interval with enough data (at least the floor); each timed call above it
  -- counted SLOW. A member is an outlier when more than (100 - percentile) % of its calls
  -- were slow, i.e. its percentile latency is above lt, while the median member's is
  -- not (a pool that slows down as a whole ejects nobody). With no lt yet: its mean
  -- latency above factor x the median member's (and above the floor).
  local lt = tonumber(P.f['lt'] or '0') or 0
  local new_lt = lt
  if c[C_LF] > 0 then
    local cand = {}
    for _, name in ipairs(names) do
      local r = recs[name]
      if r[ST] ~= EJECTED and r[NL] >= c[C_LV] and r[NL] > 0 then
        cand[#cand + 1] = {name, r[MS] / r[NL], r[SLOW] / r[NL]}
      end
    end
    if #cand >= c[C_LH] and #cand > 0 then
      local median = median_of(cand, 2)
      local slow = {}
      if lt > 0 then
        local q = (100 - c[C_LPCT]) / 100
        if median_of(cand, 3) <= q then
          for _, it in ipairs(cand) do
            if it[3] > q then slow[#slow + 1] = {it[1], -it[3]} end
          end
        end
      else
        for _, it in ipairs(cand) do
          if it[2] > median * c[C_LF] / 1000 and it[2] >= c[C_LMIN] then
            slow[#slow + 1] = {it[1], -it[2]}
          end
        end
      end
      if c[C_LE] > 0 then try(slow, WHY_LAT, c[C_LE]) end
      new_lt = math.floor(median * c[C_LF] / 1000)
      if new_lt < c[C_LMIN] then new_lt = c[C_LMIN] end
      if new_lt < 1 then new_lt = 1 end
    end
  end
  for _, name in ipairs(names) do
    local r = recs[name]
    if r[ST] == HEALTHY and r[MULT] > 0 and r[AT] < iv then r[MULT] = r[MULT] - 1 end
    r[POK], r[PBAD], r[PMS], r[PNL], r[PSLOW] = r[OK], r[BAD], r[MS], r[NL], r[SLOW]
    r[OK], r[BAD], r[MS], r[NL], r[SLOW] = 0, 0, 0, 0, 0
  end
  return new_lt
end

-- Expired leases (their workers died or never recorded) leave the in-flight counts.
local function reap(K, KL, P, now)
  local gone = redis.call('ZRANGEBYSCORE', KL, '-inf', now, 'LIMIT', 0, 1000)
  if #gone == 0 then return end
  for _, lease in ipairs(gone) do
    local name = string.match(lease, ' (.*)$')
    if name and P.recs[name] and (P.infl[name] or 0) > 0 then
      P.infl[name] = P.infl[name] - 1
    end
  end
  redis.call('ZREM', KL, unpack(gone))
  local fields, zero = {}, {}
  for _, name in ipairs(P.names) do
    local n = P.infl[name] or 0
    if n > 0 then
      fields[#fields + 1] = 'i:' .. name
      fields[#fields + 1] = fmt(n)
    else
      zero[#zero + 1] = 'i:' .. name
    end
  end
  if fields[1] then redis.call('HSET', K, unpack(fields)) end
  if zero[1] then redis.call('HDEL', K, unpack(zero)) end
end

local function touch(KEYS, x, now, c, fields)
  if now - x >= c[C_TTL] / 4 then
    fields[#fields + 1] = 'x'
    fields[#fields + 1] = fmt(now)
    return true
  end
  return false
end

local function expire_all(KEYS, c)
  for j = 1, 3 do redis.call('PEXPIRE', KEYS[j], c[C_TTL]) end
end

-- history entries, after the state; events are rare, so each refreshes the stream's TTL
-- (after the state, and never failing the call: a foreign key there loses the history only)
local function log_events(KH, events, c, now)
  for _, e in ipairs(events) do
    redis.pcall('XADD', KH, 'MAXLEN', '~', 1000, '*', 'member', e[1], 'event', e[2],
                'why', fmt(e[3]), 'until', fmt(e[4]), 'actor', e[5], 'at', fmt(now))
  end
  if events[1] then redis.pcall('PEXPIRE', KH, c[C_TTL]) end
end

local function bad_args(op) return args_error('bad pool arguments for ' .. tostring(op)) end

local function valid_member(name)
  return name ~= nil and name ~= '' and #name <= 200 and not string.find(name, '[%s%c]')
end

-- a candidate's weight (a member of weight 0 is a candidate only when all are: then 1)
local function wt(view)
  local w = view[W]
  return w > 0 and w or 1
end

-- weighted choice of one of `list` (names) by a random integer; skips `not_this`
local function weighted(list, recs, rnd, not_this)
  local total = 0
  for _, name in ipairs(list) do
    if name ~= not_this then total = total + wt(recs[name]) end
  end
  if total <= 0 then return nil end
  local target = rnd % total
  for _, name in ipairs(list) do
    if name ~= not_this then
      target = target - wt(recs[name])
      if target < 0 then return name end
    end
  end
  return nil
end

-- rendezvous (highest random weight) hashing: the same key finds the same member while
-- it is a candidate, and only the keys of a member that left move
local function sticky(list, recs, key)
  local best, best_score = nil, nil
  for _, name in ipairs(list) do
    local h = tonumber(string.sub(redis.sha1hex(key .. '\n' .. name), 1, 13), 16)
    local u = (h + 1) / 4503599627370497  -- (0, 1]
    local score = -math.log(u) / wt(recs[name])
    if best_score == nil or score < best_score then best, best_score = name, score end
  end
  return best
end

-- What a pick reads of every member: the record's first five fields (ST..EW), matched
-- without decoding the rest; the in-flight counts; the pool's own fields. Members in the
-- hash's order (a pick's draws need a fixed order within one call, not a sorted one).
local function load_pick(K)
  local raw = redis.pcall('HGETALL', K)
  if raw['err'] then return nil, failed_on(K, 'hash', raw) end
  local names, recs, infl, f, raws = {}, {}, {}, {}, {}
  local sub, byte, num = string.sub, string.byte, tonumber
  local n = 0
  for j = 1, #raw, 2 do
    local k = raw[j]
    local b1, b2 = byte(k, 1, 2)
    if b1 == 109 and b2 == 58 then  -- 'm:'
      local name, v = sub(k, 3), raw[j + 1]
      local view = pick_view(sub(v, 1, PREFIX_LEN))  -- shared: never written to
      if not view then return nil, schema_error(K, 'has a corrupt member record ' .. name) end
      n = n + 1
      names[n] = name
      recs[name], raws[name] = view, v
    elseif b1 == 105 and b2 == 58 then  -- 'i:'
      infl[sub(k, 3)] = num(raw[j + 1]) or 0
    else
      f[k] = raw[j + 1]
    end
  end
  if #raw > 0 and f['v'] ~= '1' then
    return nil, schema_error(K, 'has layout version ' .. tostring(f['v']) .. ', this client speaks 1')
  end
  return {names = names, recs = recs, infl = infl, f = f, raws = raws}
end

-- a member's latency EWMA (µs), for balance=latency only
local function ewma_of(P, name)
  return tonumber(string.match(P.raws[name], '^%d+ %d+ %d+ %d+ (%d+)')) or 0
end

local function pick(KEYS, ARGV, c, now)
  local K, KL = KEYS[1], KEYS[2]
  local token, r1, r2 = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
  local key, avoid = ARGV[6] or '', ARGV[7] or ''
  if token == nil or not r1 or not r2 or string.find(token, ' ') then return bad_args('pick') end
  local P, err = load_pick(K)
  if not P then return err end
  local names, recs, infl = P.names, P.recs, P.infl
  if #names == 0 then return {'', -1, now} end
  local avoided = {}
  for name in string.gmatch(avoid, '%S+') do avoided[name] = true end
  local up, cand, probes = 0, {}, {}
  for _, name in ipairs(names) do
    local r = recs[name]
    local st = state_of(r, now)
    if st ~= EJECTED then
      up = up + 1
      if st == PROBING then
        local left = c[C_PROBES] - r[PR]
        if (infl[name] or 0) < left then probes[#probes + 1] = name end
      elseif r[W] > 0 then
        cand[#cand + 1] = name
      end
    end
  end
  local mode = 0
  if up * 100 < c[C_PANIC] * #names then  -- panic: too few healthy, route to all
    mode, cand = 1, {}
    for _, name in ipairs(names) do if recs[name][W] > 0 then cand[#cand + 1] = name end end
  else
    -- a member back from ejection gets its probes first (one pick each while it has room)
    for _, name in ipairs(probes) do
      if not avoided[name] then cand, mode = {name}, 2; break end
    end
  end
  if #cand == 0 then
    for _, name in ipairs(names) do if recs[name][W] > 0 then cand[#cand + 1] = name end end
    if #cand == 0 then cand = names end
  end
  if avoid ~= '' and mode ~= 2 then
    local kept = {}
    for _, name in ipairs(cand) do if not avoided[name] then kept[#kept + 1] = name end end
    if #kept > 0 then cand = kept end
  end
  local chosen
  if #cand == 1 then
    chosen = cand[1]
  elseif key ~= '' then
    chosen = sticky(cand, recs, key)
  else
    local a = weighted(cand, recs, r1)
    chosen = a
    if c[C_BAL] ~= 2 then
      local b = weighted(cand, recs, r2, a)
      if b then
        local wa, wb = wt(recs[a]), wt(recs[b])
        local la, lb = (infl[a] or 0) * wb, (infl[b] or 0) * wa
        if c[C_BAL] == 1 then  -- latency first (an unmeasured member is tried), then load
          local ea, eb = ewma_of(P, a), ewma_of(P, b)
          if ea ~= eb then la, lb = ea * wb, eb * wa end
        end
        if lb < la then chosen = b end
      end
    end
  end
  local x = tonumber(P.f['x'] or '0') or 0
  local refresh = now - x >= c[C_TTL] / 4
  if token ~= '' then  -- the lease first: a foreign leases key fails before any write
    local added = redis.pcall('ZADD', KL, now + c[C_LEASE], token .. ' ' .. chosen)
    if type(added) == 'table' and added['err'] then return failed_on(KL, 'zset', added) end
    redis.call('HINCRBY', K, 'i:' .. chosen, 1)
    if not refresh then  -- no lease was out: the zset is new, give it the TTL
      local out = 0
      for _, n in pairs(infl) do out = out + n end
      if out <= 0 then redis.call('PEXPIRE', KL, c[C_TTL]) end
    end
  end
  if refresh then
    redis.call('HSET', K, 'x', fmt(now))
    expire_all(KEYS, c)
  end
  return {chosen, mode, now}
end

-- apply one outcome to member record r; whole(): the whole pool (read only when an
-- ejection is due: the cap), nil on foreign data; returns the event this call made to it
-- ('' none), nil when whole() failed (nothing written yet)
local function apply(whole, name, r, c, now, roll, outcome, dur, eject_ms, events, lt)
  local failed = outcome ~= 's'
  if outcome == 'l' and c[C_SPLIT] == 0 then outcome = 'g' end  -- Envoy: seen as a 503/504
  if dur >= 0 then
    r[MS], r[NL] = r[MS] + dur, r[NL] + 1
    if lt > 0 and dur > lt then r[SLOW] = r[SLOW] + 1 end
    local us = dur * 1000
    r[EW] = r[EW] == 0 and us or math.floor(r[EW] * 0.8 + us * 0.2)
  end
  if failed then r[BAD] = r[BAD] + 1 else r[OK] = r[OK] + 1 end
  if outcome == 's' then
    r[C5], r[CG], r[CL], r[CAPPED] = 0, 0, 0, 0
  elseif outcome == 'e' then
    r[C5], r[CG] = r[C5] + 1, 0
  elseif outcome == 'g' then
    r[C5], r[CG] = r[C5] + 1, r[CG] + 1
  else
    r[CL] = r[CL] + 1
  end
  local st = state_of(r, now)
  local ev = ''
  if st == PROBING and r[ST] == EJECTED then  -- its ejection ended: it probes now
    r[ST], r[PR] = PROBING, 0
    if r[OVR] == FORCED then r[OVR] = 0 end
    ev = 'probing'
    event(events, name, ev, r)
  end
  if st == EJECTED or exempt_now(r, now) then return ev end
  if r[OVR] == EXEMPT then r[OVR], r[UNTIL] = 0, 0 end  -- the exemption ended
  local why, for_ms = nil, nil
  if eject_ms > 0 then
    why, for_ms = WHY_RA, eject_ms
  elseif st == PROBING then
    if failed then
      why = WHY_PROBE
    else
      r[PR] = r[PR] + 1
      if r[PR] >= c[C_PROBES] then r[ST], r[PR], ev = HEALTHY, 0, 'recovered' end
      return ev
    end
  elseif not failed then
    return ev
  elseif c[C_N5] > 0 and r[C5] >= c[C_N5] and enforced(c[C_E5], roll) then
    why = WHY_5XX
  elseif c[C_NG] > 0 and r[CG] >= c[C_NG] and enforced(c[C_EG], roll) then
    why = WHY_GW
  elseif c[C_NL] > 0 and r[CL] >= c[C_NL] and enforced(c[C_EL], roll) then
    why = WHY_LOCAL
  end
  if not why then return ev end
  local P = whole()
  if not P then return nil end
  if n_ejected(P, now, r) < allowed(c, #P.names) then
    eject(r, c, why, now, for_ms)
    return 'ejected'
  end
  return refuse(r, why) and 'capped' or 'still capped'
end

local function write_all(K, P, fields)
  for _, name in ipairs(P.names) do
    fields[#fields + 1] = 'm:' .. name
    fields[#fields + 1] = encode(P.recs[name])
  end
  redis.call('HSET', K, unpack(fields))
end

-- The lease of a pick goes (the first write of a record: a foreign leases key fails
-- before any other); true when it was there. Its member's in-flight count goes down.
local function release(K, KL, token, name, member_exists)
  if token == '' then return false end
  local gone = redis.pcall('ZREM', KL, token .. ' ' .. name)
  if type(gone) == 'table' and gone['err'] then return false, failed_on(KL, 'zset', gone) end
  if gone == 1 and member_exists then
    -- a member with nothing in flight has no i: field: one field less for every pick
    if redis.call('HINCRBY', K, 'i:' .. name, -1) <= 0 then redis.call('HDEL', K, 'i:' .. name) end
    return true
  end
  return false
end

-- The usual record: a success of a healthy member, no interval to close. The record's
-- fields stay the strings matched, but the four that change (no decode, no encode of
-- the rest); nil when the member is not healthy (the general path then).
local function quick_success(s, dur, lt)
  local t = {string.match(s, REC_PATTERN)}
  if t[NREC] == nil or t[ST] ~= '0' then return nil end
  t[OK] = t[OK] + 1
  if dur >= 0 then
    t[MS], t[NL] = t[MS] + dur, t[NL] + 1
    if lt > 0 and dur > lt then t[SLOW] = t[SLOW] + 1 end
    local ew, us = t[EW] + 0, dur * 1000
    t[EW] = ew == 0 and us or math.floor(ew * 0.8 + us * 0.2)
  end
  t[C5], t[CG], t[CL], t[CAPPED] = '0', '0', '0', '0'
  return t
end

local function record(KEYS, ARGV, c, now, roll)
  local K, KL, KH = KEYS[1], KEYS[2], KEYS[3]
  local name, token, outcome = ARGV[3], ARGV[4], ARGV[5]
  local dur, eject_ms = tonumber(ARGV[6]), tonumber(ARGV[7])
  if not valid_member(name) or token == nil or not dur or not eject_ms or eject_ms < 0
      or not (outcome == 's' or outcome == 'e' or outcome == 'g' or outcome == 'l'
              or outcome == 'n') then
    return bad_args('record')
  end
  dur, eject_ms = math.floor(dur), math.floor(eject_ms)
  local raw = redis.pcall('HMGET', K, 'v', 'iv', 'x', 'm:' .. name, 'lt')
  if raw['err'] then return failed_on(K, 'hash', raw) end
  if raw[1] and raw[1] ~= '1' then
    return schema_error(K, 'has layout version ' .. tostring(raw[1]) .. ', this client speaks 1')
  end
  local P, err = nil, nil
  local iv, x = tonumber(raw[2] or '0') or 0, tonumber(raw[3] or '0') or 0
  local lt = tonumber(raw[5] or '0') or 0
  local due = now - iv >= c[C_IV]
  if outcome == 'n' and not due then  -- an abandoned call: its lease goes, nothing else
    local _, err0 = release(K, KL, token, name, raw[4] ~= false)
    if err0 then return err0 end
    local view = raw[4] and pick_view(string.sub(raw[4], 1, PREFIX_LEN))
    if not view then return {-1, 0, 0, '', now} end
    return {state_of(view, now), view[UNTIL], 0, '', now}
  end
  if outcome == 's' and eject_ms == 0 and raw[4] and not due then
    local t = quick_success(raw[4], dur, lt)
    if t then
      local gone, err = release(K, KL, token, name, true)
      if err then return err end
      local fields = {'m:' .. name, table.concat(t, ' ')}
      local refresh = touch(KEYS, x, now, c, fields)
      redis.call('HSET', K, unpack(fields))
      if refresh then expire_all(KEYS, c) end
      return {HEALTHY, t[UNTIL], t[WHY], '', now}
    end
  end
  if due then  -- this call closes the interval: the whole pool is read
    P, err = load_all(K)
    if not P then return err end
  end
  local r = nil
  if raw[4] then
    r = P and P.recs[name] or decode(raw[4])
    if not r then return schema_error(K, 'has a corrupt member record ' .. name) end
  end
  local events = {}
  local new_lt = lt
  if due then new_lt = close_interval(P, c, now, roll, events) end
  local ev = ''
  if r and outcome ~= 'n' then
    -- an ejection needs the whole pool (the cap): read then, still before any write
    local function whole()
      if not P then
        P, err = load_all(K)
        if not P then return nil end
        P.recs[name] = r
      end
      return P
    end
    ev = apply(whole, name, r, c, now, roll, outcome, dur, eject_ms, events, new_lt)
    if not ev then return err end
    if ev == 'still capped' then ev = 'capped'
    elseif ev ~= '' and ev ~= 'probing' then event(events, name, ev, r) end
  end
  -- validated: the writes begin
  local gone, err2 = release(K, KL, token, name, r ~= nil)
  if err2 then return err2 end
  if gone and due then P.infl[name] = math.max(0, (P.infl[name] or 1) - 1) end
  local fields = {}
  if due then
    reap(K, KL, P, now)
    local step = c[C_IV]
    local start = iv > 0 and (now - (now - iv) % step) or now
    fields = {'v', '1', 'iv', fmt(start), 'cfg', ARGV[2], 'lt', fmt(new_lt)}
  end
  local refresh = touch(KEYS, x, now, c, fields)
  if due then
    write_all(K, P, fields)
  elseif r then
    fields[#fields + 1] = 'm:' .. name
    fields[#fields + 1] = encode(r)
    redis.call('HSET', K, unpack(fields))
  elseif fields[1] then
    redis.call('HSET', K, unpack(fields))
  end
  if refresh then expire_all(KEYS, c) end
  log_events(KH, events, c, now)
  if not r then return {-1, 0, 0, '', now} end
  return {state_of(r, now), r[UNTIL], r[WHY], ev, now}
end

local function members(KEYS, ARGV, c, now)
  local K = KEYS[1]
  local mode = ARGV[3]
  local given, order = {}, {}
  local step = mode == 'remove' and 1 or 2
  if not (mode == 'replace' or mode == 'init' or mode == 'add' or mode == 'remove') then
    return bad_args('members')
  end
  for j = 4, #ARGV, step do
    local name, w = ARGV[j], step == 2 and tonumber(ARGV[j + 1]) or 1
    if not valid_member(name) or not w or w < 0 or w > 1000000 or w ~= math.floor(w) then
      return bad_args('members')
    end
    if not given[name] then order[#order + 1] = name end
    given[name] = w
  end
  local P, err = load_all(K)
  if not P then return err end
  if mode == 'init' and #P.names > 0 then return {#P.names, 0} end
  local changed, gone = 0, {}
  if mode == 'replace' or mode == 'remove' then
    for _, name in ipairs(P.names) do
      local drop = (mode == 'replace') ~= (given[name] ~= nil)
      if drop then gone[#gone + 1] = name end
    end
  end
  local fields = {'v', '1', 'x', fmt(now)}
  if not P.f['iv'] then fields[5], fields[6] = 'iv', fmt(now) end
  if mode ~= 'remove' then
    for _, name in ipairs(order) do
      local r = P.recs[name]
      if not r then
        r = fresh(given[name])
        changed = changed + 1
      elseif r[W] ~= given[name] then
        r[W] = given[name]
        changed = changed + 1
      else
        r = nil
      end
      if r then
        fields[#fields + 1] = 'm:' .. name
        fields[#fields + 1] = encode(r)
      end
    end
  end
  redis.call('HSET', K, unpack(fields))
  for _, name in ipairs(gone) do
    redis.call('HDEL', K, 'm:' .. name, 'i:' .. name)
    changed = changed + 1
  end
  expire_all(KEYS, c)
  local count = #P.names - #gone
  for _, name in ipairs(order) do
    if mode ~= 'remove' and not P.recs[name] then count = count + 1 end
  end
  return {count, changed}
end

local function operator(KEYS, ARGV, c, now, op)
  local K, KH = KEYS[1], KEYS[3]
  local name = ARGV[3]
  local ms, actor
  if op == 'eject' or op == 'exempt' then
    ms, actor = tonumber(ARGV[4]), ARGV[5] or ''
    if not ms or ms < 0 then return bad_args(op) end
  else
    actor = ARGV[4] or ''
  end
  if not valid_member(name) then return bad_args(op) end
  local raw = redis.pcall('HMGET', K, 'v', 'm:' .. name)
  if raw['err'] then return failed_on(K, 'hash', raw) end
  if raw[1] and raw[1] ~= '1' then
    return schema_error(K, 'has layout version ' .. tostring(raw[1]) .. ', this client speaks 1')
  end
  if not raw[2] then return {-1, 0, 0, '', now} end
  local r = decode(raw[2])
  if not r then return schema_error(K, 'has a corrupt member record ' .. name) end
  local ev
  if op == 'eject' then  -- an operator's ejection: not bound by the cap, no multiplier
    r[ST], r[UNTIL], r[WHY], r[AT], r[OVR], r[PR] = EJECTED, now + (ms > 0 and ms or FOREVER),
      WHY_OP, now, FORCED, 0
    r[TOT] = r[TOT] + 1
    ev = 'ejected'
  else  -- Envoy #6016: back at once, healthy, its ejection count forgotten; exempt:
        -- the same, and never ejected by the rules until an uneject (a breaker's DISABLED)
    r[ST], r[UNTIL], r[OVR], r[PR], r[MULT] = HEALTHY, 0, op == 'exempt' and EXEMPT or 0, 0, 0
    if op == 'exempt' and ms > 0 then r[UNTIL] = now + ms end
    r[C5], r[CG], r[CL], r[CAPPED] = 0, 0, 0, 0
    ev = op == 'exempt' and 'exempted' or 'unejected'
  end
  redis.call('HSET', K, 'v', '1', 'm:' .. name, encode(r), 'x', fmt(now))
  expire_all(KEYS, c)
  log_events(KH, {{name, ev, r[WHY], r[UNTIL], actor}}, c, now)
  return {state_of(r, now), r[UNTIL], r[WHY], ev, now}
end

local function status(KEYS, now)
  local P, err = load_all(KEYS[1])
  if not P then return err end
  local out = {now, tonumber(P.f['iv'] or '0') or 0, P.f['cfg'] or '',
               tonumber(P.f['lt'] or '0') or 0, #P.names}
  for _, name in ipairs(P.names) do
    out[#out + 1] = name
    out[#out + 1] = encode(P.recs[name])
    out[#out + 1] = P.infl[name] or 0
  end
  return out
end

-- A retry's two calls in one: record the last attempt (ARGV[8..12] as record's 3..7),
-- then pick (ARGV[3..7], the recorded member avoided too) on the same server time.
local function repick(KEYS, ARGV, c, now, roll)
  local token, r1, r2 = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
  if token == nil or not r1 or not r2 or string.find(token, ' ') or ARGV[12] == nil then
    return bad_args('repick')
  end
  local done = record(KEYS, {'record', ARGV[2], ARGV[8], ARGV[9], ARGV[10], ARGV[11],
                             ARGV[12]}, c, now, roll)
  if done['err'] then return done end
  local avoid = ARGV[7] or ''
  avoid = avoid == '' and ARGV[8] or (avoid .. ' ' .. ARGV[8])
  local picked = pick(KEYS, {'pick', ARGV[2], token, ARGV[4], ARGV[5], ARGV[6], avoid}, c, now)
  if picked['err'] then return picked end
  return {picked[1], picked[2], picked[3], done[1], done[2], done[3], done[4]}
end

return function(KEYS, ARGV)
  local op = ARGV[1]
  local c = parse_cfg(ARGV[2])
  if not c and not (op == 'status') then return bad_args(op) end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local roll = tonumber(t[2])
  if op == 'pick' then return pick(KEYS, ARGV, c, now) end
  if op == 'record' then return record(KEYS, ARGV, c, now, roll) end
  if op == 'repick' then return repick(KEYS, ARGV, c, now, roll) end
  if op == 'members' then return members(KEYS, ARGV, c, now) end
  if op == 'eject' or op == 'uneject' or op == 'exempt' then
    return operator(KEYS, ARGV, c, now, op)
  end
  if op == 'status' then return status(KEYS, now) end
  return bad_args(op)
end

end)(prelude())
return main(KEYS, ARGV)
