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
-- set:     ARGV[5] target state or RESET or TRIP, ARGV[6] reason, ARGV[7] actor,
--          ARGV[8] hold for ms or "", ARGV[9] hold until epoch ms or "" (an override
--          that expires by server time; TRIP: the OPEN wait ends then)
--
-- Reply: {state, wait_ms, permitted, transitions, calls, failures, slow,
--         total_ms, rejected, drift, stored_config, now_ms, since_ms,
--         probes_in_flight, reason, actor, event_errors, override_until,
--         probe_figures};
--         transitions is a list
--         of {from, to, reason, failure_rate, slow_rate} (rates as strings, as in
--         the history stream); reason/actor: of the transition into the current
--         state; event_errors: '' or why the history XADD / PUBLISH failed;
--         override_until: server ms when the operator's override ends (0: none);
--         probe_figures: 1 when calls..total_ms are the half-open probes' figures.
--
-- Writes: every check runs before the first write, and every write is deferred
-- to the end, where the state hash is written FIRST: if Redis refuses it (OOM,
-- ACL), nothing was written, and a rejection is still answered (a rejection
-- never needs a successful write). The history XADD and the PUBLISH come last,
-- through pcall: their failure can neither abort nor undo the transition.
--
-- Performance: this runs on every protected call, so the hot path (a record
-- in CLOSED) allocates almost nothing: the state lives in plain locals with
-- dirty flags instead of tables, the config and window buckets are parsed with
-- one string.match each, and no helper tables are built per call.

local K_STATE, K_WIN, K_PROBES, K_HIST = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op, name, cfg_wire, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local floor, tonumber, match = math.floor, tonumber, string.match

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)

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

local err = foreign_type(K_STATE, 'hash') or foreign_type(K_WIN, 'hash')
         or foreign_type(K_PROBES, 'zset') or foreign_type(K_HIST, 'stream')
if err then return err end

-- Config wire string: version 1, then 11 fields, then optional ones (a client
-- writes them only up to the last one that differs from its default, so a
-- default config has the same string as before they existed): 13 initial state
-- (C, F, M, D), 14 state after max wait in half-open (O, C), 15 open wait
-- multiplier per consecutive open, 16 max open wait ms (0: key TTL), 17 wait
-- randomization factor; fields past the 17th are ignored. Returns window type,
-- size, min calls, failure and slow thresholds, open wait, permitted probes, max
-- half-open, lease, ttl, initial state, state after max half-open, multiplier,
-- max wait, randomization (or nil when bad); field 12 (slow call duration) is
-- only checked to be a number.
local CFG_PATTERN = '^1;([CT]);([^;]*);([^;]*);([^;]*);([^;]*);([^;]*);([^;]*);' ..
                    '([^;]*);([^;]*);([^;]*);([^;]*)(.*)'
local INITIAL = {C = 'CLOSED', F = 'FORCED_OPEN', M = 'METRICS_ONLY', D = 'DISABLED'}
local AFTER_HALF_OPEN = {O = 'OPEN', C = 'CLOSED'}
local function parse_config(wire)
  local window_type, size, min_calls, failure_thr, slow_thr, open_wait, probes, max_half_open,
        lease, ttl, slow_duration, tail = match(wire, CFG_PATTERN)
  if not window_type then return nil end
  local initial, after_half_open, mult, max_open, rnd = 'CLOSED', 'OPEN', 1, 0, 0
  if tail ~= '' then
    local f13, f14, f15, f16, f17 = match(tail, '^;([^;]*);?([^;]*);?([^;]*);?([^;]*);?([^;]*)')
    if not f13 then return nil end
    initial = INITIAL[f13]
    after_half_open = AFTER_HALF_OPEN[f14 == '' and 'O' or f14]
    mult, max_open, rnd = tonumber(f15 == '' and '1' or f15), tonumber(f16 == '' and '0' or f16),
                          tonumber(f17 == '' and '0' or f17)
    if not (initial and after_half_open and mult and max_open and rnd) then return nil end
  end
  size, min_calls, failure_thr = tonumber(size), tonumber(min_calls), tonumber(failure_thr)
  slow_thr, open_wait, probes = tonumber(slow_thr), tonumber(open_wait), tonumber(probes)
  max_half_open, lease, ttl = tonumber(max_half_open), tonumber(lease), tonumber(ttl)
  if not (size and min_calls and failure_thr and slow_thr and open_wait and probes
          and max_half_open and lease and ttl and tonumber(slow_duration)) then
    return nil
  end
  return window_type, size, min_calls, failure_thr, slow_thr, open_wait, probes,
         max_half_open, lease, ttl, initial, after_half_open, mult, max_open, rnd
end

-- Load the state hash ---------------------------------------------------------
local raw = redis.call('HMGET', K_STATE, 'v', 'cfg', 'state', 'since', 'open_until', 'calls',
                 'failures', 'slow', 'total_ms', 'head', 'wsec', 'hp_issued', 'hp_done',
                 'hp_fail', 'hp_slow', 'rejected', 'gen', 'ttl_at', 'reason', 'actor',
                 'ov_until', 'opens')
local s_state = raw[3]
local exists = s_state ~= false
if not exists and redis.call('EXISTS', K_STATE) == 1 then
  return schema_error(K_STATE, 'is a hash without a state field')
end
local s_v, s_cfg = raw[1], raw[2]
if s_v and s_v ~= '1' then
  return schema_error(K_STATE, 'has schema version ' .. tostring(s_v) .. ', this client speaks 1')
end
local function valid_state(s)
  return s == 'CLOSED' or s == 'OPEN' or s == 'HALF_OPEN' or s == 'FORCED_OPEN'
      or s == 'DISABLED' or s == 'METRICS_ONLY'
end
if exists and not valid_state(s_state) then
  return schema_error(K_STATE, 'has unknown state ' .. tostring(s_state))
end
-- raw[4..18] are counters: missing reads as 0, anything else must be a number.
for i = 4, 18 do
  local s = raw[i]
  if s then
    local n = tonumber(s)
    if n == nil then
      local names = {'since', 'open_until', 'calls', 'failures', 'slow', 'total_ms', 'head',
                     'wsec', 'hp_issued', 'hp_done', 'hp_fail', 'hp_slow', 'rejected', 'gen',
                     'ttl_at'}
      return schema_error(K_STATE, 'field ' .. names[i - 3] .. ' is not a number')
    end
    raw[i] = n
  else
    raw[i] = 0
  end
end
local since, open_until, calls, failures, slow = raw[4], raw[5], raw[6], raw[7], raw[8]
local total_ms, head, wsec, hp_issued, hp_done = raw[9], raw[10], raw[11], raw[12], raw[13]
local hp_fail, hp_slow, rejected, gen, ttl_at = raw[14], raw[15], raw[16], raw[17], raw[18]
local s_reason, s_actor = raw[19] or '', raw[20] or ''
local opens = tonumber(raw[22] or '0')  -- consecutive opens since the last close
if not opens then return schema_error(K_STATE, 'field opens is not a number') end
local d_opens = false
local ov_until = 0  -- when an operator's override ends (server ms; 0: none)
if raw[21] then
  ov_until = tonumber(raw[21])
  if not ov_until then return schema_error(K_STATE, 'field ov_until is not a number') end
end

-- Dirty flags: which fields the final HSET writes.
local d_v, d_cfg, d_state, d_trans, d_totals, d_head, d_wsec = false, false, false, false,
                                                              false, false, false
-- d_probes_issued: hp_issued; d_probe_results: hp_done, hp_fail, hp_slow.
local d_probes_issued, d_probe_results, d_rej, d_drift, d_ttl = false, false, false, false,
                                                                 false
-- Keys this call may have created: they get a TTL now.
local fresh_win, fresh_probes, fresh_hist = false, false, false
-- Deferred writes (applied after the state hash, see the header).
local del_win, del_probes, clear_drift = false, false, false
local win_sets, win_dels = {}, {}      -- window slot -> new bucket / true
local probe_add, probe_rem = nil, nil  -- a lease to add {token, deadline}; a token to drop

local wtype, wsize, min_calls, f_thr, s_thr, open_wait, probes_max, max_half_open,
      lease_ms, ttl_ms, initial_state, after_half_open, wait_mult, max_open_wait,
      wait_rnd = parse_config(cfg_wire)
if not wtype then return redis.error_reply('DISTBREAKER_ARGS bad config ' .. cfg_wire) end

local adopt = (op == 'set' and ARGV[5] == 'RESET')
local drift = 0
if not exists then
  if op == 'state' then
    return {initial_state, 0, 1, {}, 0, 0, 0, 0, 0, 0, '', now, now, 0}
  end
  s_state, since, s_v, s_cfg = 'CLOSED', now, '1', cfg_wire
  -- An operator action on a name without keys stores no config ('unset'): the
  -- first worker's call stores its own (no drift warning for it), and the
  -- breaker starts in the config's initial state.
  if op == 'set' then
    s_cfg = 'unset'
  elseif initial_state ~= 'CLOSED' then
    s_state, s_reason, d_trans = initial_state, 'initial state', true
  end
  d_v, d_cfg, d_state = true, true, true
elseif s_cfg == 'unset' then
  -- the caller's config governs this call; only a protected call stores it
  adopt = op == 'acquire' or op == 'record'
  if adopt then s_cfg = cfg_wire end
elseif adopt or not s_cfg then
  s_cfg = cfg_wire
  adopt = true  -- persist it
elseif s_cfg ~= cfg_wire then
  drift = 1
  wtype, wsize, min_calls, f_thr, s_thr, open_wait, probes_max, max_half_open,
    lease_ms, ttl_ms, initial_state, after_half_open, wait_mult, max_open_wait,
    wait_rnd = parse_config(s_cfg)
  if not wtype then return schema_error(K_STATE, 'field cfg is not a v1 config') end
end

if adopt then d_cfg = true end
-- Remember the newest config that disagreed with the stored one (for operators:
-- `distbreaker show`); written only when it changes, cleared by RESET.
if drift == 1 then
  if redis.call('HGET', K_STATE, 'drift_cfg') ~= cfg_wire then d_drift = true end
elseif adopt and redis.call('HEXISTS', K_STATE, 'drift_cfg') == 1 then
  clear_drift = true
end

-- Events ----------------------------------------------------------------------
local transitions = {}
-- {from, to, reason, frate, srate, gen, actor, kind, until}: history (+ pub/sub for a
-- transition, kind ''), at the end. Other kinds (history only, never reported as a
-- transition): 'restart' (TRIP on OPEN restarted the wait), 'override' (an override
-- on the current state was set, changed or lifted), 'override_end' (a held CLOSED
-- was released; the other overrides end with a transition).
local events = {}
local d_ov = false

local function json_str(s)
  s = tostring(s)
  s = string.gsub(s, '[%c"\\]', function(c) return string.format('\\u%04x', string.byte(c)) end)
  return '"' .. s .. '"'
end

local function rate(part, whole)
  if whole <= 0 then return -1 end
  return floor(part * 10000 / whole) / 100
end

local function clear_window()
  del_win, win_sets, win_dels = true, {}, {}
  calls, failures, slow, total_ms, head, wsec = 0, 0, 0, 0, 0, 0
  d_totals, d_head, d_wsec = true, true, true
end

-- A window bucket as this call sees it (its own deferred writes included).
local function win_get(slot)
  local pending = win_sets[slot]
  if pending then return pending end
  if del_win or win_dels[slot] then return nil end
  return redis.call('HGET', K_WIN, slot) or nil
end

-- The open wait (Resilience4j's waitIntervalFunctionInOpenState): the configured
-- wait times multiplier^(consecutive opens - 1), capped (at the key TTL when no
-- cap is configured), spread by +-randomization with the server clock's
-- microseconds as the random draw; a close resets the count.
local function wait_in_open()
  if wait_mult == 1 and wait_rnd == 0 then return open_wait end
  local cap = max_open_wait > 0 and max_open_wait or ttl_ms
  local w = open_wait
  if opens > 1 then w = open_wait * wait_mult ^ math.min(opens - 1, 200) end
  if w > cap then w = cap end
  if wait_rnd > 0 then
    w = w * (1 + wait_rnd * (2 * (tonumber(t[2]) % 1000) / 999 - 1))
  end
  return math.max(1, floor(w))
end

local function transition(to, reason, actor)
  local from = s_state
  local frate, srate
  if from == 'HALF_OPEN' then
    frate, srate = rate(hp_fail, hp_done), rate(hp_slow, hp_done)
  else
    frate, srate = rate(failures, calls), rate(slow, calls)
  end
  actor = actor or ''
  s_state, since, gen, s_reason, s_actor = to, now, gen + 1, reason, actor
  d_state, d_trans = true, true
  ov_until = 0
  if to == 'OPEN' then
    opens, d_opens = opens + 1, true
    open_until = now + wait_in_open()
  else
    open_until = 0
    if to == 'CLOSED' and opens ~= 0 then opens, d_opens = 0, true end
  end
  if to == 'OPEN' and from ~= 'HALF_OPEN' and hp_done ~= 0 then
    -- an OPEN reports the half-open figures only when it follows a half-open verdict
    hp_done, hp_fail, hp_slow, d_probe_results = 0, 0, 0, true
  end
  if to == 'HALF_OPEN' then
    hp_issued, hp_done, hp_fail, hp_slow = 0, 0, 0, 0
    d_probes_issued, d_probe_results = true, true
    del_probes, probe_add, probe_rem = true, nil, nil
  elseif to ~= 'OPEN' then
    clear_window()
    del_probes, probe_add, probe_rem = true, nil, nil
  end
  transitions[#transitions + 1] = {from, to, reason, tostring(frate), tostring(srate)}
  events[#events + 1] = {from, to, reason, frate, srate, gen, actor, '', 0}
  fresh_hist = true
end

-- A history entry that is not a transition (see `events`).
local function note(kind, reason, actor, until_ms)
  events[#events + 1] = {s_state, s_state, reason, -1, -1, gen, actor or '', kind, until_ms}
  fresh_hist = true
end

-- The operator's override ended (by server time): FORCED_OPEN goes on as an OPEN
-- whose wait is over (HALF_OPEN: probes check the service before traffic returns,
-- as after Resilience4j's transitionToOpenStateFor); DISABLED and METRICS_ONLY
-- return to CLOSED; a held CLOSED simply resumes its state machine.
local function end_override()
  local ended = ov_until
  if s_state == 'FORCED_OPEN' then
    transition('HALF_OPEN', 'override ended')
  elseif s_state == 'DISABLED' or s_state == 'METRICS_ONLY' then
    transition('CLOSED', 'override ended')
  else
    ov_until, d_ov = 0, true
    note('override_end', 'override ended', '', ended)
    return
  end
  events[#events][9] = ended
end

-- Sliding window (pre-aggregated, O(1) per recorded outcome) -----------------
-- A window bucket is a comma-separated list of integers (3 in a count window,
-- 5 in a time window); anything else was written by someone else. Raised (not
-- returned) because it is found deep in the window code, before the state hash
-- is written.
local function corrupt_bucket(value)
  error('DISTBREAKER_SCHEMA ' .. K_WIN .. ' holds a corrupt bucket ' ..
        string.format('%q', string.sub(value, 1, 40)))
end

-- A time bucket "<sec>,<calls>,<failures>,<slow>,<ms>": returns the last four.
local function time_bucket(value)
  local a, b, c, d, e = match(value, '^([^,]*),([^,]*),([^,]*),([^,]*),([^,]*)$')
  a, b, c, d, e = tonumber(a), tonumber(b), tonumber(c), tonumber(d), tonumber(e)
  if not (a and b and c and d and e) then corrupt_bucket(value) end
  return b, c, d, e
end

local function evict_time_buckets()
  local sec = floor(now / 1000)
  if wsec == sec then return end
  if wsec == 0 or sec - wsec >= wsize or sec < wsec then
    if calls ~= 0 or wsec ~= 0 then clear_window() end
  else
    for s = wsec + 1, sec do
      local slot = s % wsize
      local old = win_get(slot)
      if old then
        local c, f, sl, m = time_bucket(old)
        calls, failures, slow, total_ms = calls - c, failures - f, slow - sl, total_ms - m
        d_totals = true
        win_sets[slot], win_dels[slot] = nil, true
      end
    end
  end
  wsec, d_wsec = sec, true
end

local function record_window(ok, fails, slows, ms)
  local n = ok + fails
  if n <= 0 then return end
  if calls == 0 then fresh_win = true end
  if wtype == 'T' then
    local sec = floor(now / 1000)
    local slot = sec % wsize
    local old = win_get(slot)
    local c, f, s, m = 0, 0, 0, 0
    if old then c, f, s, m = time_bucket(old) end
    win_sets[slot] = sec .. ',' .. (c + n) .. ',' .. (f + fails) .. ',' .. (s + slows) ..
                     ',' .. (m + ms)
    calls, failures, slow, total_ms = calls + n, failures + fails, slow + slows, total_ms + ms
    d_totals = true
    return
  end
  -- Count window: a ring of wsize outcome slots "failed,slow,ms".
  local per_ms = floor(ms / n)
  local first = n - wsize  -- outcomes that would be evicted within this batch
  -- Only the last wsize outcomes of a batch can stay in the ring.
  for i = math.max(1, first + 1), n do
    -- spread failures and slow calls evenly over the batch
    local f = floor(i * fails / n) - floor((i - 1) * fails / n)
    local s = floor(i * slows / n) - floor((i - 1) * slows / n)
    local m = per_ms + ((i == 1) and (ms - per_ms * n) or 0)
    local old = win_get(head)
    if old then
      local a, b, c = match(old, '^([^,]*),([^,]*),([^,]*)$')
      a, b, c = tonumber(a), tonumber(b), tonumber(c)
      if not (a and b and c) then corrupt_bucket(old) end
      calls, failures, slow, total_ms = calls - 1, failures - a, slow - b, total_ms - c
    end
    win_sets[head] = f .. ',' .. s .. ',' .. m
    calls, failures, slow, total_ms = calls + 1, failures + f, slow + s, total_ms + m
    head = (head + 1) % wsize
    d_totals, d_head = true, true
  end
end

local function rate_exceeded(n, fails, slows)
  return fails * 100 >= f_thr * n or slows * 100 >= s_thr * n
end

local function describe(n, fails, slows)
  if fails * 100 >= f_thr * n then
    return 'failure rate ' .. rate(fails, n) .. '% >= ' .. f_thr .. '%'
  end
  return 'slow call rate ' .. rate(slows, n) .. '% >= ' .. s_thr .. '%'
end

-- Time-driven transitions and lease reaping ---------------------------------
local function advance()
  if ov_until > 0 and now >= ov_until then end_override() end
  if wtype == 'T' then evict_time_buckets() end
  if s_state == 'OPEN' and now >= open_until then
    transition('HALF_OPEN', 'wait in open state elapsed')
  end
  if s_state == 'HALF_OPEN' then
    if max_half_open > 0 and now >= since + max_half_open then
      transition(after_half_open, 'max wait in half-open elapsed')
      return
    end
  end
end

-- Live half-open leases (deadline after now). Admission is derived from these and
-- the stored verdict count (hp_done), so a missing probes key (evicted) can never
-- wedge HALF_OPEN: its leases are simply gone. Expired ones are reaped at the end.
-- Counted once per call (admission and the reply's probes in flight share it).
local live_count = nil
local function live_probes()
  if del_probes then return 0 end
  if live_count == nil then live_count = redis.call('ZCOUNT', K_PROBES, '(' .. now, '+inf') end
  return live_count
end

-- Whether `token` holds a live lease (this call's own deferred lease included).
local function holds_lease(token)
  if probe_add and probe_add[1] == token then return true end
  if del_probes then return false end
  local deadline = redis.call('ZSCORE', K_PROBES, token)
  return deadline ~= false and deadline ~= nil and tonumber(deadline) > now
end

-- Operations ------------------------------------------------------------------
local permitted = 1
if op == 'record' then
  -- Arguments are checked before advance(): an error must not leave a
  -- time-driven transition half done (published but not saved).
  local token = ARGV[5]
  local ok, fails = tonumber(ARGV[6]), tonumber(ARGV[7])
  local slows, ms = tonumber(ARGV[8]), tonumber(ARGV[9])
  if not (ok and fails and slows and ms) or ok < 0 or fails < 0 or slows < 0 or ms < 0
      or ok ~= floor(ok) or fails ~= floor(fails) or slows ~= floor(slows)
      or ms ~= floor(ms) then
    return redis.error_reply('DISTBREAKER_ARGS record counts must be integers >= 0')
  end
  if slows > ok + fails then
    return redis.error_reply('DISTBREAKER_ARGS record: more slow calls than calls')
  end
  advance()
  local st = s_state
  if st == 'CLOSED' or st == 'METRICS_ONLY' then
    record_window(ok, fails, slows, ms)
    if st == 'CLOSED' and ov_until == 0 and calls >= min_calls and calls > 0
        and rate_exceeded(calls, failures, slow) then
      transition('OPEN', describe(calls, failures, slow))
    end
  elseif st == 'HALF_OPEN' and token ~= '' and holds_lease(token) then
    probe_rem = token
    if ok + fails == 0 then
      -- an ignored probe hands its slot back (Resilience4j releasePermission)
      hp_issued, d_probes_issued = math.max(0, hp_issued - 1), true
    end
    hp_done, hp_fail, hp_slow = hp_done + ok + fails, hp_fail + fails, hp_slow + slows
    d_probe_results = true
    if hp_done >= probes_max then
      if rate_exceeded(hp_done, hp_fail, hp_slow) then
        transition('OPEN', 'half-open probes: ' .. describe(hp_done, hp_fail, hp_slow))
      else
        transition('CLOSED', 'half-open probes succeeded')
      end
    end
  end
elseif op == 'state' then
  advance()
elseif op == 'acquire' then
  local token = ARGV[5]
  if not token or token == '' then
    return redis.error_reply('DISTBREAKER_ARGS acquire needs a probe token')
  end
  advance()
  local st = s_state
  if st == 'OPEN' or st == 'FORCED_OPEN' then
    permitted = 0
  elseif st == 'HALF_OPEN' then
    if holds_lease(token) then
      -- the token already holds a live lease: a retried acquire takes no second slot
    elseif live_probes() + hp_done < probes_max then
      probe_add = {token, now + lease_ms}
      fresh_probes = true
      hp_issued, d_probes_issued = hp_issued + 1, true
    else
      permitted = 0
    end
  end
  if permitted == 0 then rejected, d_rej = rejected + 1, true end
elseif op == 'set' then
  local target, reason, actor = ARGV[5], ARGV[6], ARGV[7]
  local hold_for, hold_until, hold = ARGV[8] or '', ARGV[9] or '', 0
  if hold_for ~= '' or hold_until ~= '' then
    local v = tonumber(hold_for ~= '' and hold_for or hold_until)
    if hold_for ~= '' and hold_until ~= '' then
      return redis.error_reply('DISTBREAKER_ARGS give a hold duration or an end, not both')
    end
    if not v or v ~= floor(v) then
      return redis.error_reply('DISTBREAKER_ARGS hold ms must be an integer')
    end
    if hold_for ~= '' then hold = now + v else hold = v end
    if hold <= now then
      return redis.error_reply('DISTBREAKER_ARGS the override would end in the past')
    end
    if target == 'RESET' or target == 'HALF_OPEN' or target == 'OPEN' then
      return redis.error_reply('DISTBREAKER_ARGS ' .. tostring(target) .. ' takes no end')
    end
  end
  advance()
  if target == 'RESET' then
    if s_state ~= 'CLOSED' then
      transition('CLOSED', reason, actor)
    else
      clear_window()
      del_probes = true
      if ov_until > 0 then  -- RESET lifts a held CLOSED too
        ov_until, d_ov = 0, true
        note('override', reason, actor, 0)
      end
    end
  elseif target == 'TRIP' then
    if s_state == 'OPEN' then
      -- a same-state move: the wait restarts, recorded as a restart, not a transition
      s_reason, s_actor, d_trans = reason, actor, true
      open_until = now + wait_in_open()
      if hold > 0 then open_until = hold end
      note('restart', reason, actor, hold)
    elseif s_state ~= 'FORCED_OPEN' and s_state ~= 'DISABLED' then
      transition('OPEN', reason, actor)
      if hold > 0 then open_until = hold; events[#events][9] = hold end
    end
  elseif valid_state(target) and target ~= 'OPEN' and target ~= 'HALF_OPEN' then
    if s_state ~= target then
      transition(target, reason, actor)
      if hold > 0 then ov_until = hold; events[#events][9] = hold end
    elseif hold ~= ov_until then
      ov_until, d_ov, s_reason, s_actor, d_trans = hold, true, reason, actor, true
      note('override', reason, actor, hold)
    end
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
local writes = op ~= 'state' or d_v or d_cfg or d_state or d_trans or d_totals or d_head
               or d_wsec or d_probes_issued or d_probe_results or d_rej or d_drift or d_ov
local refresh_all = writes and (op == 'set' or now - ttl_at >= ttl_ms / 2 or ttl_at > now)
if refresh_all then ttl_at, d_ttl = now, true end
local flat, n = {}, 0
if d_totals then
  flat[1], flat[2], flat[3], flat[4] = 'calls', calls, 'failures', failures
  flat[5], flat[6], flat[7], flat[8] = 'slow', slow, 'total_ms', total_ms
  n = 8
end
if d_head then flat[n + 1] = 'head'; flat[n + 2] = head; n = n + 2 end
if d_ttl then flat[n + 1] = 'ttl_at'; flat[n + 2] = ttl_at; n = n + 2 end
if d_v then flat[n + 1] = 'v'; flat[n + 2] = s_v; n = n + 2 end
if d_cfg then flat[n + 1] = 'cfg'; flat[n + 2] = s_cfg; n = n + 2 end
if d_state then
  flat[n + 1] = 'state'; flat[n + 2] = s_state
  flat[n + 3] = 'since'; flat[n + 4] = since; n = n + 4
end
if d_trans then
  flat[n + 1] = 'gen'; flat[n + 2] = gen
  flat[n + 3] = 'open_until'; flat[n + 4] = open_until
  flat[n + 5] = 'reason'; flat[n + 6] = s_reason
  flat[n + 7] = 'actor'; flat[n + 8] = s_actor
  flat[n + 9] = 'ov_until'; flat[n + 10] = ov_until; n = n + 10
elseif d_ov then
  flat[n + 1] = 'ov_until'; flat[n + 2] = ov_until; n = n + 2
end
if d_wsec then flat[n + 1] = 'wsec'; flat[n + 2] = wsec; n = n + 2 end
if d_probes_issued then flat[n + 1] = 'hp_issued'; flat[n + 2] = hp_issued; n = n + 2 end
if d_probe_results then
  flat[n + 1] = 'hp_done'; flat[n + 2] = hp_done; flat[n + 3] = 'hp_fail'
  flat[n + 4] = hp_fail; flat[n + 5] = 'hp_slow'; flat[n + 6] = hp_slow; n = n + 6
end
if d_rej then flat[n + 1] = 'rejected'; flat[n + 2] = rejected; n = n + 2 end
if d_opens then flat[n + 1] = 'opens'; flat[n + 2] = opens; n = n + 2 end
if d_drift then
  flat[n + 1] = 'drift_cfg'; flat[n + 2] = cfg_wire
  flat[n + 3] = 'drift_at'; flat[n + 4] = now; n = n + 4
end
local wait_ms = 0
if s_state == 'OPEN' then
  wait_ms = math.max(0, open_until - now)
elseif s_state == 'HALF_OPEN' and permitted == 0 and not del_probes then
  local first = redis.call('ZRANGEBYSCORE', K_PROBES, '(' .. now, '+inf', 'WITHSCORES',
                           'LIMIT', 0, 1)
  if first[2] then wait_ms = math.min(open_wait, math.max(0, tonumber(first[2]) - now)) end
end
local stored = ''
if drift == 1 then stored = s_cfg end

local in_flight = 0  -- live leases once this call's deferred writes are applied
if s_state == 'HALF_OPEN' then
  in_flight = live_probes()
  if probe_add then in_flight = in_flight + 1 end
  if probe_rem then in_flight = math.max(0, in_flight - 1) end
end

local function reply(event_errors)
  -- HALF_OPEN, and an OPEN that a half-open verdict made (Resilience4j keeps the
  -- probes' figures there), report the probes' figures; element 19 says so.
  if s_state == 'HALF_OPEN' or (s_state == 'OPEN' and hp_done > 0) then
    return {s_state, wait_ms, permitted, transitions, hp_done, hp_fail, hp_slow, 0,
            rejected, drift, stored, now, since, in_flight, s_reason, s_actor, event_errors,
            ov_until, 1}
  end
  return {s_state, wait_ms, permitted, transitions, calls, failures, slow, total_ms,
          rejected, drift, stored, now, since, 0, s_reason, s_actor, event_errors, ov_until, 0}
end

-- The state hash first: if Redis refuses it (OOM, ACL), nothing was written.
if n > 0 then
  local written = redis.pcall('HSET', K_STATE, unpack(flat, 1, n))
  if type(written) == 'table' and written.err then
    if op == 'acquire' and permitted == 0 then
      -- A rejection stands without its counter (and without a time-driven
      -- transition it computed: the next call computes it again).
      if d_rej then rejected = rejected - 1 end
      return reply('state not saved: ' .. written.err)
    end
    return redis.error_reply(written.err)
  end
end
if clear_drift then redis.call('HDEL', K_STATE, 'drift_cfg', 'drift_at') end
if del_win then redis.call('DEL', K_WIN) end
local dels, n_dels = {}, 0
for slot in pairs(win_dels) do n_dels = n_dels + 1; dels[n_dels] = slot end
if n_dels > 0 then redis.call('HDEL', K_WIN, unpack(dels, 1, n_dels)) end
local sets, n_sets = {}, 0
for slot, value in pairs(win_sets) do
  sets[n_sets + 1], sets[n_sets + 2] = slot, value
  n_sets = n_sets + 2
end
if n_sets > 0 then redis.call('HSET', K_WIN, unpack(sets, 1, n_sets)) end
if del_probes then
  redis.call('DEL', K_PROBES)
elseif s_state == 'HALF_OPEN' and (probe_add or probe_rem or op ~= 'state') then
  redis.call('ZREMRANGEBYSCORE', K_PROBES, '-inf', now)
end
if probe_rem then redis.call('ZREM', K_PROBES, probe_rem) end
if probe_add then redis.call('ZADD', K_PROBES, probe_add[2], probe_add[1]) end

if refresh_all then
  -- an override or a long OPEN wait keeps the keys for key_ttl past its end
  local keep, held = ttl_ms, ov_until
  if s_state == 'OPEN' and open_until > held then held = open_until end
  if held > now then keep = math.max(ttl_ms, held - now + ttl_ms) end
  redis.call('PEXPIRE', K_STATE, keep)
  redis.call('PEXPIRE', K_WIN, keep)
  redis.call('PEXPIRE', K_PROBES, keep)
  redis.call('PEXPIRE', K_HIST, keep)
else
  if fresh_win then redis.call('PEXPIRE', K_WIN, ttl_ms) end
  if fresh_probes then redis.call('PEXPIRE', K_PROBES, ttl_ms) end
  if fresh_hist then redis.call('PEXPIRE', K_HIST, ttl_ms) end
end

-- History and pub/sub last, through pcall: a failure (e.g. an ACL without channel
-- permission) can neither abort nor undo the transition; the reply reports it.
local event_errors = ''
for _, e in ipairs(events) do
  local entry = {'XADD', K_HIST, 'MAXLEN', '1000', '*', 'from', e[1], 'to', e[2],
       'reason', e[3], 'at_ms', now, 'failure_rate', tostring(e[4]),
       'slow_rate', tostring(e[5]), 'gen', e[6], 'actor', e[7]}
  if e[8] ~= '' then entry[#entry + 1] = 'kind'; entry[#entry + 1] = e[8] end
  if e[9] and e[9] > 0 then entry[#entry + 1] = 'until_ms'; entry[#entry + 1] = e[9] end
  local added = redis.pcall(unpack(entry))
  if type(added) == 'table' and added.err then
    event_errors = event_errors .. 'history: ' .. added.err .. '; '
  end
  if e[8] == '' then
    local published = redis.pcall('PUBLISH', channel, '{"name":' .. json_str(name) ..
      ',"from":"' .. e[1] .. '","to":"' .. e[2] .. '","reason":' .. json_str(e[3]) ..
      ',"at_ms":' .. now .. ',"failure_rate":' .. e[4] .. ',"slow_rate":' .. e[5] ..
      ',"gen":' .. e[6] .. ',"actor":' .. json_str(e[7]) ..
      ((e[9] > 0) and (',"until_ms":' .. e[9]) or '') .. '}')
    if type(published) == 'table' and published.err then
      event_errors = event_errors .. 'publish: ' .. published.err .. '; '
    end
  end
end
return reply(event_errors)
