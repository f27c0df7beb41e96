--!lib
-- The breaker's config wire string (docs/KEY_SCHEMA.md, "Config wire string"): parsed
-- into the units the state record stores, and single fields read by position. Pure
-- functions: no per-call state.
local floor, tonumber, match = math.floor, tonumber, string.match
local INITIAL = {C = 'CLOSED', F = 'FORCED_OPEN', M = 'METRICS_ONLY', D = 'DISABLED'}
local AFTER_HALF_OPEN = {O = 'OPEN', C = 'CLOSED'}

-- Wire string: version 1, then 11 fields, then optional ones: 13 initial state, 14
-- state after max wait in half-open, 15 open wait multiplier, 16 max open wait ms, 17
-- randomization. The config (rates in 1/10000 of a percent, multiplier and
-- randomization in millionths, named as the record's fields), or false.
local CFG_PATTERN = '^1;([CT]);([^;]*);([^;]*);([^;]*);([^;]*);([^;]*);([^;]*);' ..
                    '([^;]*);([^;]*);([^;]*);([^;]*)(.*)'
local function parse(wire)
  local wt, size, mc, fthr, sthr, ow, pr, mho, lease, ttl, sd, tail = match(wire, CFG_PATTERN)
  if not wt then return false end
  local init, after, mult, mo, rnd = 'CLOSED', 'OPEN', 1, 0, 0
  if tail ~= '' then
    local f13, f14, f15, f16, f17 = match(tail, '^;([^;]*);?([^;]*);?([^;]*);?([^;]*);?([^;]*)')
    if not f13 then return false end
    init, after = INITIAL[f13], AFTER_HALF_OPEN[f14 == '' and 'O' or f14]
    mult, mo = tonumber(f15 == '' and '1' or f15), tonumber(f16 == '' and '0' or f16)
    rnd = tonumber(f17 == '' and '0' or f17)
    if not (init and after and mult and mo and rnd) then return false end
  end
  size, mc, fthr, sthr = tonumber(size), tonumber(mc), tonumber(fthr), tonumber(sthr)
  ow, pr, mho, lease, ttl, sd = tonumber(ow), tonumber(pr), tonumber(mho), tonumber(lease),
                                tonumber(ttl), tonumber(sd)
  if not (size and mc and fthr and sthr and ow and pr and mho and lease and ttl and sd) then
    return false
  end
  return {window_type = (wt == 'T') and 2 or 0, window_size = size, min_calls = mc,
          failure_threshold = floor(fthr * 10000 + 0.5),
          slow_threshold = floor(sthr * 10000 + 0.5), open_wait = ow, probes_max = pr,
          max_half_open = mho, lease_ms = lease, ttl_ms = ttl, slow_ms = sd,
          initial_state = init, after_half_open = after,
          wait_mult = floor(mult * 1000000 + 0.5), max_open_wait = mo,
          wait_rnd = floor(rnd * 1000000 + 0.5)}
end

-- Field `index` (1-based) of a wire string, or nil (the quorum's fields 20 and 21).
local function wire_field(wire, index)
  local i = 0
  for part in string.gmatch(wire .. ';', '([^;]*);') do
    i = i + 1
    if i == index then return part end
  end
  return nil
end

return {parse = parse, field = wire_field}
