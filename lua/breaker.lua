-- distbreaker circuit breaker, key schema v1. The single source of truth for
-- the fleet-wide state machine (docs/KEY_SCHEMA.md documents every field).
--
-- KEYS[1] state hash   KEYS[2] window hash   KEYS[3] probe leases (zset)
-- KEYS[4] history stream
-- ARGV[1] op: acquire | record | state | set
-- ARGV[2] breaker name (for events)   ARGV[3] config wire string
-- ARGV[4] pub/sub channel
-- acquire: ARGV[5] probe token
-- record:  ARGV[5] probe token or "", ARGV[6] successes, ARGV[7] failures,
--          ARGV[8] slow calls, ARGV[9] total duration ms (all zero with a
--          token: an ignored probe, whose slot is handed back)
-- set:     ARGV[5] target state or RESET or TRIP, ARGV[6] reason, ARGV[7] actor
--
-- Reply: {state, wait_ms, permitted, transitions, calls, failures, slow,
--         total_ms, rejected, drift, stored_config, now_ms, since_ms,
--         probes_in_flight}; transitions is a list of {from, to, reason,
--         failure_rate, slow_rate} (rates as strings, as in the history stream).

local K_STATE, K_WIN, K_PROBES, K_HIST = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op, name, cfg_wire, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function schema_error(key, msg)
  return redis.error_reply('DISTBREAKER_SCHEMA ' .. key .. ' ' .. msg)
end

local function key_type(key)
  local r = redis.call('TYPE', key)
  if type(r) == 'table' then return r['ok'] end
  return r
end

for _, kt in ipairs({{K_STATE, 'hash'}, {K_WIN, 'hash'}, {K_PROBES, 'zset'},
                     {K_HIST, 'stream'}}) do
  local found = key_type(kt[1])
  if found ~= 'none' and found ~= kt[2] then
    return schema_error(kt[1], 'holds a ' .. found .. ', expected a ' .. kt[2])
  end
end

local function split(s, sep)
  local out, start = {}, 1
  while true do
    local i = string.find(s, sep, start, true)
    if not i then out[#out + 1] = string.sub(s, start); return out end
    out[#out + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end

local function parse_config(wire)
  local f = split(wire, ';')
  if f[1] ~= '1' or #f < 12 then return nil end
  local c = {
    window_type = f[2], window_size = tonumber(f[3]), min_calls = tonumber(f[4]),
    failure_threshold = tonumber(f[5]), slow_threshold = tonumber(f[6]),
    wait_ms = tonumber(f[7]), permitted = tonumber(f[8]),
    max_half_open_ms = tonumber(f[9]), lease_ms = tonumber(f[10]),
    ttl_ms = tonumber(f[11]), slow_ms = tonumber(f[12]),
  }
  for _, v in pairs(c) do if v == nil then return nil end end
  if c.window_type ~= 'C' and c.window_type ~= 'T' then return nil end
  return c
end

-- Load the state hash ---------------------------------------------------------
local FIELDS = {'v', 'cfg', 'state', 'since', 'open_until', 'calls', 'failures',
                'slow', 'total_ms', 'head', 'wsec', 'hp_issued', 'hp_done',
                'hp_fail', 'hp_slow', 'rejected', 'gen', 'ttl_at'}
local raw = redis.call('HMGET', K_STATE, unpack(FIELDS))
local h = {}
local exists = raw[3] ~= false
if not exists and redis.call('EXISTS', K_STATE) == 1 then
  return schema_error(K_STATE, 'is a hash without a state field')
end
for i, f in ipairs(FIELDS) do h[f] = raw[i] end

if h.v and h.v ~= '1' then
  return schema_error(K_STATE, 'has schema version ' .. tostring(h.v) .. ', this client speaks 1')
end
local VALID = {CLOSED = 1, OPEN = 1, HALF_OPEN = 1, FORCED_OPEN = 1, DISABLED = 1,
               METRICS_ONLY = 1}
if exists and not VALID[h.state] then
  return schema_error(K_STATE, 'has unknown state ' .. tostring(h.state))
end
for i = 4, #FIELDS do
  local f = FIELDS[i]
  if h[f] then
    local n = tonumber(h[f])
    if n == nil then return schema_error(K_STATE, 'field ' .. f .. ' is not a number') end
    h[f] = n
  else
    h[f] = 0
  end
end

local caller_cfg = parse_config(cfg_wire)
if not caller_cfg then return redis.error_reply('DISTBREAKER_ARGS bad config ' .. cfg_wire) end

local adopt = (op == 'set' and ARGV[5] == 'RESET')
local drift = 0
local cfg = caller_cfg
if not exists then
  if op == 'state' then
    return {'CLOSED', 0, 1, {}, 0, 0, 0, 0, 0, 0, '', now, now, 0}
  end
  h.state, h.since, h.v, h.cfg = 'CLOSED', now, '1', cfg_wire
elseif adopt or not h.cfg then
  h.cfg = cfg_wire
  adopt = true  -- persist it
elseif h.cfg ~= cfg_wire then
  drift = 1
  cfg = parse_config(h.cfg)
  if not cfg then return schema_error(K_STATE, 'field cfg is not a v1 config') end
end

local dirty = {}
local function put(f, v) h[f] = v; dirty[f] = true end
if not exists then
  for _, f in ipairs({'v', 'cfg', 'state', 'since'}) do dirty[f] = true end
end
if adopt then dirty.cfg = true end
-- Remember the newest config that disagreed with the stored one (for operators:
-- `distbreaker show`); written only when it changes, cleared by RESET.
if drift == 1 then
  if redis.call('HGET', K_STATE, 'drift_cfg') ~= cfg_wire then
    put('drift_cfg', cfg_wire); put('drift_at', now)
  end
elseif adopt and redis.call('HEXISTS', K_STATE, 'drift_cfg') == 1 then
  redis.call('HDEL', K_STATE, 'drift_cfg', 'drift_at')
end

-- Events ----------------------------------------------------------------------
local transitions = {}

local function json_str(s)
  s = tostring(s)
  s = string.gsub(s, '[%c"\\]', function(c) return string.format('\\u%04x', string.byte(c)) end)
  return '"' .. s .. '"'
end

local function rate(part, whole)
  if whole <= 0 then return -1 end
  return math.floor(part * 10000 / whole) / 100
end

local fresh_keys = {}  -- keys this call may have created: they get a TTL now

local function clear_window()
  redis.call('DEL', K_WIN)
  put('calls', 0); put('failures', 0); put('slow', 0); put('total_ms', 0)
  put('head', 0); put('wsec', 0)
end

local function transition(to, reason, actor)
  local from = h.state
  local frate, srate
  if from == 'HALF_OPEN' then
    frate, srate = rate(h.hp_fail, h.hp_done), rate(h.hp_slow, h.hp_done)
  else
    frate, srate = rate(h.failures, h.calls), rate(h.slow, h.calls)
  end
  put('state', to); put('since', now); put('gen', h.gen + 1)
  if to == 'OPEN' then
    put('open_until', now + cfg.wait_ms)
  else
    put('open_until', 0)
  end
  if to == 'HALF_OPEN' then
    put('hp_issued', 0); put('hp_done', 0); put('hp_fail', 0); put('hp_slow', 0)
    redis.call('DEL', K_PROBES)
  elseif to ~= 'OPEN' then
    clear_window()
    redis.call('DEL', K_PROBES)
  end
  transitions[#transitions + 1] = {from, to, reason, tostring(frate), tostring(srate)}
  fresh_keys[#fresh_keys + 1] = K_HIST
  actor = actor or ''
  redis.call('XADD', K_HIST, 'MAXLEN', '1000', '*', 'from', from, 'to', to,
             'reason', reason, 'at_ms', now, 'failure_rate', tostring(frate),
             'slow_rate', tostring(srate), 'gen', h.gen, 'actor', actor)
  redis.call('PUBLISH', channel, '{"name":' .. json_str(name) .. ',"from":"' .. from ..
    '","to":"' .. to .. '","reason":' .. json_str(reason) .. ',"at_ms":' .. now ..
    ',"failure_rate":' .. frate .. ',"slow_rate":' .. srate .. ',"gen":' .. h.gen ..
    ',"actor":' .. json_str(actor) .. '}')
end

-- Sliding window (pre-aggregated, O(1) per recorded outcome) -----------------
-- A window bucket is a comma-separated list of `want` integers; anything else
-- was written by someone else. Raised (not returned) because it is found deep
-- in the window code, before the state hash is written.
local function bucket(value, want)
  local b = split(value, ',')
  local ok = #b == want
  for i = 1, want do
    b[i] = tonumber(b[i])
    if b[i] == nil then ok = false end
  end
  if not ok then
    error('DISTBREAKER_SCHEMA ' .. K_WIN .. ' holds a corrupt bucket ' ..
          string.format('%q', string.sub(value, 1, 40)))
  end
  return b
end

local function add_totals(calls, fails, slows, ms)
  put('calls', h.calls + calls); put('failures', h.failures + fails)
  put('slow', h.slow + slows); put('total_ms', h.total_ms + ms)
end

local function evict_time_buckets()
  if cfg.window_type ~= 'T' then return end
  local sec = math.floor(now / 1000)
  if h.wsec == sec then return end
  if h.wsec == 0 or sec - h.wsec >= cfg.window_size or sec < h.wsec then
    if h.calls ~= 0 or h.wsec ~= 0 then clear_window() end
  else
    for s = h.wsec + 1, sec do
      local slot = s % cfg.window_size
      local old = redis.call('HGET', K_WIN, slot)
      if old then
        local b = bucket(old, 5)
        add_totals(-b[2], -b[3], -b[4], -b[5])
        redis.call('HDEL', K_WIN, slot)
      end
    end
  end
  put('wsec', sec)
end

local function record_window(ok, fails, slows, ms)
  local n = ok + fails
  if n <= 0 then return end
  if cfg.window_type == 'T' then
    local sec = math.floor(now / 1000)
    local slot = sec % cfg.window_size
    local old = redis.call('HGET', K_WIN, slot)
    local c, f, s, m = 0, 0, 0, 0
    if old then
      local b = bucket(old, 5)
      c, f, s, m = b[2], b[3], b[4], b[5]
    end
    redis.call('HSET', K_WIN, slot, sec .. ',' .. (c + n) .. ',' .. (f + fails) .. ',' ..
               (s + slows) .. ',' .. (m + ms))
    if h.calls == 0 then fresh_keys[#fresh_keys + 1] = K_WIN end
    add_totals(n, fails, slows, ms)
    return
  end
  if h.calls == 0 then fresh_keys[#fresh_keys + 1] = K_WIN end
  -- Count window: a ring of window_size outcome slots "failed,slow,ms".
  local per_ms = math.floor(ms / n)
  local first = n - cfg.window_size  -- outcomes that would be evicted within this batch
  -- Only the last window_size outcomes of a batch can stay in the ring.
  for i = math.max(1, first + 1), n do
    -- spread failures and slow calls evenly over the batch
    local f = math.floor(i * fails / n) - math.floor((i - 1) * fails / n)
    local s = math.floor(i * slows / n) - math.floor((i - 1) * slows / n)
    local m = per_ms + ((i == 1) and (ms - per_ms * n) or 0)
    local slot = h.head
    local old = redis.call('HGET', K_WIN, slot)
    if old then
      local b = bucket(old, 3)
      add_totals(-1, -b[1], -b[2], -b[3])
    end
    redis.call('HSET', K_WIN, slot, f .. ',' .. s .. ',' .. m)
    add_totals(1, f, s, m)
    put('head', (h.head + 1) % cfg.window_size)
  end
end

local function rate_exceeded(calls, fails, slows)
  return fails * 100 >= cfg.failure_threshold * calls
      or slows * 100 >= cfg.slow_threshold * calls
end

local function describe(calls, fails, slows)
  if fails * 100 >= cfg.failure_threshold * calls then
    return 'failure rate ' .. rate(fails, calls) .. '% >= ' .. cfg.failure_threshold .. '%'
  end
  return 'slow call rate ' .. rate(slows, calls) .. '% >= ' .. cfg.slow_threshold .. '%'
end

-- Time-driven transitions and lease reaping ---------------------------------
local function advance()
  evict_time_buckets()
  if h.state == 'OPEN' and now >= h.open_until then
    transition('HALF_OPEN', 'wait in open state elapsed')
  end
  if h.state == 'HALF_OPEN' then
    if cfg.max_half_open_ms > 0 and now >= h.since + cfg.max_half_open_ms then
      transition('OPEN', 'max wait in half-open elapsed')
      return
    end
    local reaped = redis.call('ZREMRANGEBYSCORE', K_PROBES, '-inf', now)
    if reaped > 0 then put('hp_issued', math.max(0, h.hp_issued - reaped)) end
  end
end

local function half_open_verdict()
  if h.hp_done < cfg.permitted then return end
  if rate_exceeded(h.hp_done, h.hp_fail, h.hp_slow) then
    transition('OPEN', 'half-open probes: ' .. describe(h.hp_done, h.hp_fail, h.hp_slow))
  else
    transition('CLOSED', 'half-open probes succeeded')
  end
end

-- Operations ------------------------------------------------------------------
local permitted = 1
if op == 'state' then
  advance()
elseif op == 'acquire' then
  local token = ARGV[5]
  if not token or token == '' then
    return redis.error_reply('DISTBREAKER_ARGS acquire needs a probe token')
  end
  advance()
  local st = h.state
  if st == 'OPEN' or st == 'FORCED_OPEN' then
    permitted = 0
  elseif st == 'HALF_OPEN' then
    if redis.call('ZSCORE', K_PROBES, token) then
      -- the token already holds a live lease: a retried acquire takes no second slot
    elseif h.hp_issued < cfg.permitted then
      redis.call('ZADD', K_PROBES, now + cfg.lease_ms, token)
      fresh_keys[#fresh_keys + 1] = K_PROBES
      put('hp_issued', h.hp_issued + 1)
    else
      permitted = 0
    end
  end
  if permitted == 0 then put('rejected', h.rejected + 1) end
elseif op == 'record' then
  advance()
  local token = ARGV[5]
  local ok, fails = tonumber(ARGV[6]), tonumber(ARGV[7])
  local slows, ms = tonumber(ARGV[8]), tonumber(ARGV[9])
  for _, v in ipairs({ok or -1, fails or -1, slows or -1, ms or -1}) do
    if v < 0 or v ~= math.floor(v) then
      return redis.error_reply('DISTBREAKER_ARGS record counts must be integers >= 0')
    end
  end
  if slows > ok + fails then
    return redis.error_reply('DISTBREAKER_ARGS record: more slow calls than calls')
  end
  local st = h.state
  if st == 'CLOSED' or st == 'METRICS_ONLY' then
    record_window(ok, fails, slows, ms)
    local calls = h.calls
    if st == 'CLOSED' and calls >= cfg.min_calls and calls > 0
        and rate_exceeded(calls, h.failures, h.slow) then
      transition('OPEN', describe(calls, h.failures, h.slow))
    end
  elseif st == 'HALF_OPEN' and token ~= '' and redis.call('ZREM', K_PROBES, token) == 1 then
    if ok + fails == 0 then
      -- an ignored probe hands its slot back (Resilience4j releasePermission)
      put('hp_issued', math.max(0, h.hp_issued - 1))
    end
    put('hp_done', h.hp_done + ok + fails)
    put('hp_fail', h.hp_fail + fails)
    put('hp_slow', h.hp_slow + slows)
    half_open_verdict()
  end
elseif op == 'set' then
  advance()
  local target, reason, actor = ARGV[5], ARGV[6], ARGV[7]
  if target == 'RESET' then
    if h.state ~= 'CLOSED' then
      transition('CLOSED', reason, actor)
    else
      clear_window()
      redis.call('DEL', K_PROBES)
    end
  elseif target == 'TRIP' then
    if h.state ~= 'FORCED_OPEN' and h.state ~= 'DISABLED' then
      transition('OPEN', reason, actor)
    end
  elseif VALID[target] and target ~= 'OPEN' and target ~= 'HALF_OPEN' then
    if h.state ~= target then transition(target, reason, actor) end
  else
    return redis.error_reply('DISTBREAKER_ARGS unknown target state ' .. tostring(target))
  end
else
  return redis.error_reply('DISTBREAKER_ARGS unknown op ' .. tostring(op))
end

-- Persist what changed and refresh TTLs --------------------------------------
-- Every key's TTL is refreshed when the last refresh is ttl/2 old (or on any
-- operator action), so an active breaker never expires and a refresh costs
-- nothing on most calls; keys this call may have created get theirs at once.
local writes = next(dirty) ~= nil or op ~= 'state'
local refresh_all = writes and (op == 'set' or now - h.ttl_at >= cfg.ttl_ms / 2
                                or h.ttl_at > now)
if refresh_all then put('ttl_at', now) end
local flat = {}
for f, _ in pairs(dirty) do
  flat[#flat + 1] = f
  flat[#flat + 1] = h[f]
end
if #flat > 0 then
  redis.call('HSET', K_STATE, unpack(flat))
end
if refresh_all then
  for _, k in ipairs({K_STATE, K_WIN, K_PROBES, K_HIST}) do
    redis.call('PEXPIRE', k, cfg.ttl_ms)
  end
else
  for _, k in ipairs(fresh_keys) do
    redis.call('PEXPIRE', k, cfg.ttl_ms)
  end
end

local wait_ms = 0
if h.state == 'OPEN' then
  wait_ms = math.max(0, h.open_until - now)
elseif h.state == 'HALF_OPEN' and permitted == 0 then
  local first = redis.call('ZRANGE', K_PROBES, 0, 0, 'WITHSCORES')
  if first[2] then wait_ms = math.min(cfg.wait_ms, math.max(0, tonumber(first[2]) - now)) end
end
local stored = ''
if drift == 1 then stored = h.cfg end
local in_flight = 0
if h.state == 'HALF_OPEN' then in_flight = redis.call('ZCARD', K_PROBES) end
local calls, fails, slows, total = h.calls, h.failures, h.slow, h.total_ms
if h.state == 'HALF_OPEN' then
  calls, fails, slows, total = h.hp_done, h.hp_fail, h.hp_slow, 0
end
return {h.state, wait_ms, permitted, transitions, calls, fails, slows, total,
        h.rejected, drift, stored, now, h.since, in_flight}
