--!module needs prelude record_layout record_codec breaker_config breaker_transitions breaker_events breaker_window breaker_ops breaker_persist breaker_hot breaker_rollout breaker_sample breaker_shadow
-- distbreaker circuit breaker, key schema v2. The single source of truth for
-- the fleet-wide state machine (docs/KEY_SCHEMA.md documents every byte).
--
-- A module: the helpers below are defined once (per library load, or once per
-- EVAL), and the chunk returns the entry function(KEYS, ARGV). What holds no
-- per-call state lives in library modules (lua/lib/, named on the first line): the
-- shared prelude (error replies, the foreign-type check), the record layout
-- (generated from distbreaker/_runtime/record_layout.py) and codec, the config wire
-- string, the state machine's transition table, the history and pub/sub events, the
-- window's bytes and arithmetic (breaker_window), the ops' parts on given values
-- (breaker_ops), the header groups' bytes and the writes beyond the record
-- (breaker_persist), all values in, values out, and the hot path (breaker_hot: the
-- usual CLOSED record, in its own locals). This file keeps
-- what works on one call's state on the general path: loading the record, the
-- window's totals, the ops, deciding what to write. That state lives in the chunk's
-- locals (upvalues), every one set by `begin` at the start of a call (a script never
-- runs concurrently with another); the cold group is a table reached only through
-- `cold()`. Not one context table: in Redis's Lua 5.1 a table field costs about 68
-- (read) and 116 (write) server instructions, an upvalue about 10 (callgrind, Redis
-- 7.0); the whole state in one table made once and reused, passed as a parameter, cost
-- +12 % on the TIME-window record, the HALF_OPEN probe and the batched flush.
--
-- KEYS[1] state record (string)   KEYS[2] meta hash   KEYS[3] probe leases (zset)
-- KEYS[4] history stream; 2-4 may be left out (derived from KEYS[1], see begin)
-- ARGV[1] op: acquire | record | state | set; or ARGV of exactly two elements
--         {fingerprint, ms}: the compact record, one success, answered now_ms by the
--         hot path (lua/lib/breaker_hot.lua), or 0 when only the full record can be
--         answered: nothing is written then, and the client sends the full form
-- ARGV[2] config fingerprint (decimal: the first 12 hex digits of the SHA-1 of
--         ARGV[3], as an integer; a wrong one only costs time)
-- ARGV[3] config wire string   ARGV[4] breaker name (for events)
-- ARGV[5] pub/sub channel
-- acquire: ARGV[6] probe token
-- record:  ARGV[6] probe token or "", ARGV[7] successes, ARGV[8] failures,
--          ARGV[9] slow calls, ARGV[10] total duration ms (all zero with a
--          token: an ignored probe, whose slot is handed back); optional ARGV[11]
--          quorum mark, ARGV[12] a sampled outcome's spec (lua/lib/breaker_sample.lua)
-- set:     ARGV[6] target state or RESET or TRIP, ARGV[7] reason, ARGV[8] actor,
--          ARGV[9] hold for ms or "", ARGV[10] hold until epoch ms or ""
--
-- Reply: the full reply {state, wait_ms, permitted, transitions, calls, failures,
--         slow, total_ms, rejected, drift, stored_config, now_ms, since_ms,
--         probes_in_flight, reason, actor, event_errors, override_until,
--         probe_figures} (as in v1), or, for a record that changed nothing a
--         worker must know (no transition, no drift, no override, no event
--         error, state CLOSED, METRICS_ONLY or DISABLED), the short reply
--         {state, now_ms, since_ms}.
--
-- Writes: every check runs before the first write, and the state record is
-- written FIRST (through pcall): if Redis refuses it (OOM, ACL), nothing was
-- written, and a rejection is still answered. The meta hash, the probes, TTLs,
-- then the history XADD and the PUBLISH (through pcall: their failure can
-- neither abort nor undo the transition) follow.

local floor, tonumber, tostring = math.floor, tonumber, tostring
local max, min, unpack, rcall, pcall_ = math.max, math.min, unpack, redis.call, redis.pcall

-- The state record's layout: declared once (distbreaker/_runtime/record_layout.py),
-- generated into lua/lib/record_layout.lua, where the groups and their fields are
-- listed. The cold group (OPEN figures and the config only transitions need) is read
-- only by calls that need it; the hot group (half-open figures, magic, fingerprint,
-- the hot config, state, window totals, the write sequence number) by every call.
-- Writes go by group: counters, config (half_open alone when only it changed),
-- state (state and window). Decoders below and encoders (lua/lib/breaker_persist.lua)
-- list a group's fields in the layout's order. The hot read and the state write both
-- end with `seq` (see lua/lib/breaker_persist.lua).
local layout = record_layout
local MAGIC = layout.MAGIC
local HOT_AT, HOT_LAST, HOT_FIELDS = layout.HOT_AT, layout.HOT_LAST, layout.HOT_FIELDS
local STATE_AT = layout.STATE_AT
-- the half-open group's length, and where the state group starts, in the hot read (the
-- probe's record writes both at once: write_record)
local HOT_BYTES = layout.HOT_BYTES
local HALF_OPEN_BYTES = tonumber(layout.HALF_OPEN_LAST) - tonumber(layout.HALF_OPEN_AT) + 1
local STATE_FROM_HOT = tonumber(STATE_AT) - tonumber(layout.HOT_AT)
local sub = string.sub
local ONE_HOT_WRITE = layout.HALF_OPEN_AT == layout.HOT_AT and layout.STATE_LAST == layout.HOT_LAST
-- (the cold and config groups' offsets are read from `layout` where they are used:
-- off the hot paths, and a chunk has room for 200 locals only; the window's are in
-- lua/lib/breaker_window.lua)
local STATES = layout.STATES
local CODE = {}  -- state name -> code
for code, state_name in ipairs(STATES) do CODE[state_name] = code - 1 end

-- The record's integer codec (lua/lib/record_codec.lua); `packer` is Redis's struct
-- library, nil where there is none (fakeredis).
local packer, decode_fields = record_codec.packer, record_codec.decode_fields
local int = record_codec.int

-- Per-call state, every one set by `begin` at the start of a call, then by `load`
-- (the hot group); the cold group is only reachable through `cold()` -------------
-- the call: its keys, arguments and server time
local K_STATE, K_META, K_PROBES, K_HIST, op, name, cfg_wire, channel, argv
local now, micros
-- the record's hot group (names as in record_layout) and `exists`
local exists, s_state, fp, since, calls, failures, slow, total_ms, head, window_sec
local ttl_refreshed_at, override_until, seq, hp_done, hp_fail, hp_slow
local calls_total, failures_total  -- recorded since the record was created (counters)
-- the governing config's hot part (the hot group's fields, or this call's parsed
-- wire string: `parsed`)
local window_type, window_size, min_calls, failure_threshold, slow_threshold, ttl_ms
local probes_max, max_half_open, lease_ms
local parsed
-- the cold group: nil until `cold()` reads it
local cold_group
-- the meta hash's reason and actor (read when a reply needs them)
local reason_now, actor_now
-- what to write: header groups, meta fields, the window, probes, quorum marks, events
local dirty_half_open, dirty_window, dirty_state, dirty_counters, dirty_config
local meta_reason, meta_cfg, meta_drift, clear_drift, cfg_store, drift
local clear_ring, n_count_slots, count_slots_from, time_slot_at, time_slot_values
local clear_probes, probe_add, probe_rem, live_count, undo_bit, undo_value
local transitions, events, permitted, quorum_mark, quorum_blocked, clear_quorum_marks
local count_slot_values = {}
-- config rollouts (lua/lib/breaker_rollout.lua): ARGV[2] split into the fingerprint's
-- text and a hello's worker; the rollout hash's writes; an adoption's reason
local arg_fp_text, hello_worker, hello_bye, rollout_writes, adopted_why, adopted_deploy
-- shadow configs (lua/lib/breaker_shadow.lua): a record's counts to feed them, a hello's
-- declared shadows
local shadow_feed, shadow_decl
local rehello_due
-- The names derived from the last state key (kept across calls: a worker calls the
-- same few breakers, and building the strings costs more than comparing one).
-- (one table: `begin` is near Lua's limit of 60 upvalues per function)
local derived = {}
local fp_compared, fp_text = nil, nil  -- the stored fingerprint and its text (kept)

-- Run only on error paths and before cold-path writes (TYPE costs a command).
local schema_error, foreign_type, args_error = prelude.schema_error, prelude.foreign_type,
                                               prelude.args_error

local function foreign_keys()
  return foreign_type(K_STATE, 'string') or foreign_type(K_META, 'hash')
      or foreign_type(K_PROBES, 'zset') or foreign_type(K_HIST, 'stream')
end

-- The config wire string (lua/lib/breaker_config.lua) parsed into the governing
-- config: its hot part into the locals, its cold part (COLD_CONFIG) kept in `parsed`
-- for `cold()` (and copied into the cold group if already read); false when bad.
local COLD_CONFIG = {'open_wait', 'initial_state', 'after_half_open', 'wait_mult',
                     'max_open_wait', 'wait_rnd', 'slow_ms'}
local function parse_config(wire)
  local c = breaker_config.parse(wire)
  if not c then return false end
  window_type, window_size, min_calls = c.window_type, c.window_size, c.min_calls
  failure_threshold, slow_threshold, ttl_ms = c.failure_threshold, c.slow_threshold, c.ttl_ms
  probes_max, max_half_open, lease_ms = c.probes_max, c.max_half_open, c.lease_ms
  parsed = c
  if cold_group then
    for _, field in ipairs(COLD_CONFIG) do cold_group[field] = c[field] end
  end
  return true
end

-- The fingerprint of a wire string (what ARGV[2] should be). fakeredis's EVAL
-- has no redis.sha1hex: there (one in-process server) the caller's ARGV[2] is taken.
local function fingerprint(wire)
  if not redis.sha1hex then return tonumber(arg_fp_text) or -1 end
  return tonumber(string.sub(redis.sha1hex(wire), 1, 12), 16)
end

-- Loading the state record ----------------------------------------------------
-- Reason and actor of the current state (meta hash), read when a reply needs them.
local function load_reason()
  if reason_now ~= nil then return end
  local m = rcall('HMGET', K_META, 'reason', 'actor')
  reason_now, actor_now = m[1] or '', m[2] or ''
end

-- The cold group (fields as in record_layout: open_until, gen, opens, rejected,
-- drift_fp, and the cold config: open_wait, initial_state, after_half_open,
-- wait_mult, max_open_wait, wait_rnd, slow_ms), read once by the first use in a call
-- (one GETRANGE; OPEN, transitions, rejections, `set` and full replies need it, the
-- usual call does not). A new record's counters are zero; a config this call parsed
-- (new, unset, adopted) governs.
local function cold()
  local g = cold_group
  if g then return g end
  if exists then
    local until_ms, gen, opens, rejected, slow_total, drift_fp, wait, init, after, mult,
          max_open, rnd, slow_call = decode_fields(rcall('GETRANGE', K_STATE, layout.COLD_AT,
                                                         layout.COLD_LAST), layout.COLD_FIELDS)
    g = {open_until = until_ms, gen = gen, opens = opens, rejected = rejected,
         slow_total = slow_total, drift_fp = drift_fp, open_wait = wait,
         initial_state = STATES[init + 1],
         after_half_open = STATES[after + 1], wait_mult = mult, max_open_wait = max_open,
         wait_rnd = rnd, slow_ms = slow_call}
  else
    g = {open_until = 0, gen = 0, opens = 0, rejected = 0, slow_total = 0, drift_fp = 0}
  end
  if parsed then
    for _, field in ipairs(COLD_CONFIG) do g[field] = parsed[field] end
  elseif not (g.initial_state and g.after_half_open) then
    error('DISTBREAKER_SCHEMA ' .. K_STATE .. ' has an unknown state code')
  end
  cold_group = g
  return g
end

-- Reads the hot header; returns an error reply, or nil. Sets `exists`, the hot
-- fields and the governing config (stored, or this call's for a new or unset one).
local preread = nil  -- the hot fields the hot path read before it stepped aside
local hot_raw = nil  -- this call's hot read (write_record: the bytes between two groups)
local function load()
  local raw = preread or pcall_('GETRANGE', K_STATE, HOT_AT, HOT_LAST)
  preread, hot_raw = nil, raw
  if type(raw) == 'table' and raw.err then
    return foreign_keys() or redis.error_reply(raw.err)
  end
  local magic, code
  hp_done, hp_fail, hp_slow, probes_max, lease_ms, max_half_open, magic, fp, window_type,
    window_size, min_calls, failure_threshold, slow_threshold, ttl_ms, code, since,
    override_until, ttl_refreshed_at, calls, failures, slow, total_ms, head, window_sec,
    seq, calls_total, failures_total = decode_fields(raw, HOT_FIELDS)
  if magic ~= MAGIC then
    if raw ~= '' or rcall('EXISTS', K_STATE) == 1 then
      return schema_error(K_STATE, 'is not a distbreaker v2 state record')
    end
    exists = false
  else
    exists = true
  end
  s_state = STATES[code + 1]
  if exists and not (s_state and window_size > 0) then
    return schema_error(K_STATE, 'has an unknown state code or a bad config')
  end
  if not exists or fp == 0 then
    if not parse_config(cfg_wire) then
      return redis.error_reply('DISTBREAKER_ARGS bad config ' .. cfg_wire)
    end
  end
  return nil
end

-- The window (lua/lib/breaker_window.lua): its bytes, arithmetic and rates ----------
local rate, advance_time = breaker_window.rate, breaker_window.advance_time
local record_one, record_many, evicted = breaker_window.record_one, breaker_window.record_many,
                                         breaker_window.evicted
local write_window, exceeded, rates_text = breaker_window.write, breaker_window.exceeded,
                                          breaker_window.describe
local window_empty = breaker_window.empty
-- the bytes between the header's last field and the window (a new record's)
local HEADER_PAD = string.rep('\0', layout.WINDOW_AT - 8 * layout.HEADER_FIELDS)

local function clear_window()
  clear_ring, n_count_slots, time_slot_at, time_slot_values = true, 0, nil, nil
  clear_quorum_marks = true
  calls, failures, slow, total_ms, head, window_sec = 0, 0, 0, 0, 0, 0
  -- a time window restarts now (its epoch: `head`); its bitmaps are zeroed by its
  -- first move (lua/lib/breaker_window.lua advance_time), nothing now
  if window_type ~= 0 then
    head = floor(now / 1000)
    window_sec, clear_ring = head, false
  end
  dirty_window = true
end


-- The ops' parts on given values (lua/lib/breaker_ops.lua): a record's counts, a
-- `set`'s hold, the open wait, the quorum of failing workers.
local record_counts, wait_in_open = breaker_ops.record_counts, breaker_ops.wait_in_open
local hold_from, quorum_met = breaker_ops.hold_from, breaker_ops.quorum_met
local reset_changes = breaker_ops.reset_changes

local function transition(to, reason, actor)
  local g = cold()
  local from = s_state
  local frate, srate
  if from == 'HALF_OPEN' then
    frate, srate = rate(hp_fail, hp_done), rate(hp_slow, hp_done)
  else
    frate, srate = rate(failures, calls), rate(slow, calls)
  end
  actor = actor or ''
  s_state, since, g.gen, reason_now, actor_now = to, now, g.gen + 1, reason, actor
  dirty_state, dirty_counters, dirty_half_open, meta_reason = true, true, true, true
  override_until = 0
  if to == 'OPEN' then
    g.opens = g.opens + 1
    g.open_until = now + wait_in_open(g, ttl_ms, micros)
  else
    g.open_until = 0
    if to == 'CLOSED' then g.opens = 0 end
  end
  if to == 'OPEN' and from ~= 'HALF_OPEN' and hp_done ~= 0 then
    -- an OPEN reports the half-open figures only when it follows a half-open verdict
    hp_done, hp_fail, hp_slow = 0, 0, 0
  end
  if to == 'HALF_OPEN' then
    hp_done, hp_fail, hp_slow = 0, 0, 0
    clear_probes, probe_add, probe_rem = true, nil, nil
  elseif to ~= 'OPEN' then
    clear_window()
    clear_probes, probe_add, probe_rem = true, nil, nil
  end
  if not transitions then transitions, events = {}, {} end
  transitions[#transitions + 1] = {from, to, reason, tostring(frate), tostring(srate)}
  events[#events + 1] = {from, to, reason, frate, srate, g.gen, actor, '', 0}
end

-- The state machine (lua/lib/breaker_transitions.lua): `fire` moves the breaker on
-- an event as the table says, and answers the table's target (a state name, or a
-- marker for the caller: RESUME, RESTART, CLEAR, IGNORE).
local NEXT, REASON = breaker_transitions.NEXT, breaker_transitions.REASON
local AFTER_HALF_OPEN, RESUME = breaker_transitions.AFTER_HALF_OPEN, breaker_transitions.RESUME
local RESTART, CLEAR = breaker_transitions.RESTART, breaker_transitions.CLEAR
local IGNORE = breaker_transitions.IGNORE
local function fire(event, reason, actor)
  local to = NEXT[s_state][event]
  if to == AFTER_HALF_OPEN then to = cold().after_half_open end
  if type(to) == 'string' then transition(to, reason or REASON[event], actor) end
  return to
end

-- A history entry that is not a transition: 'restart' (TRIP on OPEN restarted the
-- wait), 'override' (an override on the current state was set, changed or lifted),
-- 'override_end' (a held CLOSED was released).
local function note(kind, reason, actor, until_ms)
  local gen = cold().gen
  if not events then transitions, events = {}, {} end
  events[#events + 1] = {s_state, s_state, reason, -1, -1, gen, actor or '', kind, until_ms}
end

-- The operator's override ended (by server time): FORCED_OPEN goes on as an OPEN
-- whose wait is over (HALF_OPEN); DISABLED and METRICS_ONLY return to CLOSED; a
-- held CLOSED simply resumes its state machine. Whoever calls first after the end
-- records it, stamped with the end time (the history's at_ms; a CLOSED's since), so
-- the history and every read agree however late that call comes. A HALF_OPEN starts
-- now, as after an OPEN wait: its max wait counts from the first call that can probe.
local function end_override()
  local ended = override_until
  local to = fire('override_ended')
  if to == RESUME then
    override_until, dirty_state = 0, true
    note('override_end', REASON.override_ended, '', ended)
  else
    events[#events][9] = ended
    if to == 'CLOSED' then since = ended end
  end
  events[#events][10] = ended
end

-- Sliding window (lua/lib/breaker_window.lua) on this call's state -------------------
-- Time window: the seconds that passed leave it (lua/lib/breaker_window.lua
-- advance_time: a few commands and bytes, whatever the gap). `head` is the window's
-- epoch second. Window type 1: a record an earlier version wrote (per-second slots):
-- re-based, and its type becomes 2 (the cumulative layout).
local function evict_time_buckets()
  local sec = floor(now / 1000)
  if window_sec == sec and window_type == 2 then return end
  if window_type == 1 then
    window_type, dirty_config = 2, true
    if window_sec ~= 0 and (sec < window_sec or sec - window_sec >= window_size) then
      clear_window()
      return
    end
    head = 0
  end
  if window_sec ~= 0 and (sec < window_sec or sec - window_sec >= window_size) then
    clear_window()  -- the whole window left (or the clock went back): it restarts
    return
  end
  local zero
  zero, time_slot_values, calls, failures, slow, total_ms, head = advance_time(
    K_STATE, sec, window_sec, window_size, calls, failures, slow, total_ms, head)
  if zero then clear_ring = true end
  window_sec, dirty_window = sec, true
end

-- Count window: one outcome goes by BITFIELD SET (the call's first write, through
-- pcall; `finish` puts the old value back if a later check refuses the call), only
-- on an existing record (full length: a new one is written whole by write_record);
-- several are read and written with the header, at the end.
local function record_count(ok, fails, slows, ms)
  if ok + fails == 1 and exists then
    local refused, bit, o, m = record_one(K_STATE, head, fails, slows, ms)
    if refused then return refused end
    undo_bit, undo_value = bit, o
    local dn, df, ds, dms = evicted(o)
    calls, failures, slow = calls + 1 - dn, failures + fails - df, slow + slows - ds
    total_ms = total_ms + m - dms
    head = (head + 1) % window_size
    dirty_window = true
    return
  end
  local dn, df, ds, dms
  count_slots_from = head
  n_count_slots, head, dn, df, ds, dms = record_many(
    K_STATE, head, window_size, ok, fails, slows, ms, count_slot_values)
  calls, failures, slow, total_ms = calls + dn, failures + df, slow + ds, total_ms + dms
  dirty_window = true
end

-- Returns why Redis refused the record's first write, or nil.
local function record_window(ok, fails, slows, ms)
  if ok + fails <= 0 then return end
  if window_type == 0 then return record_count(ok, fails, slows, ms) end
  evict_time_buckets()  -- (done by `advance` already: the outcomes count in this second)
  calls, failures, slow, total_ms = calls + ok + fails, failures + fails, slow + slows,
                                    total_ms + ms
  dirty_window = true
end

-- Time-driven transitions ---------------------------------------------------------
local function advance()
  if override_until > 0 and now >= override_until then end_override() end
  if window_type ~= 0 then evict_time_buckets() end
  if s_state == 'OPEN' then
    if now >= cold().open_until then fire('wait_elapsed') end
  end
  if s_state == 'HALF_OPEN' then
    if max_half_open > 0 and now >= since + max_half_open then fire('max_wait_elapsed') end
  end
end

-- Live half-open leases (deadline after now): admission is these plus the stored
-- verdicts (hp_done), so an evicted probes key cannot wedge HALF_OPEN.
-- A read of the probes zset: a key of another type is a schema error (raised:
-- these reads come before any write of the calls that use them).
local function probes_read(cmd, a, b)
  local r
  if b then r = pcall_(cmd, K_PROBES, a, b) else r = pcall_(cmd, K_PROBES, a) end
  if type(r) == 'table' and r.err then
    local err = foreign_type(K_PROBES, 'zset')
    error(err and err.err or r.err)
  end
  return r
end

local function live_probes()
  if clear_probes then return 0 end
  if live_count == nil then live_count = probes_read('ZCOUNT', '(' .. int(now), '+inf') end
  return live_count
end

local function holds_lease(token)
  if probe_add and probe_add == token then return true end
  if clear_probes then return false end
  local deadline = probes_read('ZSCORE', token)
  return deadline ~= false and deadline ~= nil and tonumber(deadline) > now
end


-- Operations --------------------------------------------------------------------

local function op_record()
  local token = argv[6]
  local ok, fails, slows, ms = record_counts(argv[7], argv[8], argv[9], argv[10])
  if not ok then return fails end
  -- shadow configs (seq's bit 32) are fed these outcomes after the writes
  if seq >= 4294967296 and ok + fails > 0 then shadow_feed = {ok, fails, slows, ms} end
  advance()
  local st = s_state
  if st == 'CLOSED' or st == 'METRICS_ONLY' then
    local refused = record_window(ok, fails, slows, ms)
    if refused then return redis.error_reply(refused) end
    calls_total, failures_total = calls_total + ok + fails, failures_total + fails
    if slows > 0 then  -- the slow-call counter is in the counters group (slow calls only)
      local g = cold()
      g.slow_total, dirty_counters = g.slow_total + slows, true
    end
    local mark = argv[11]
    if mark and mark ~= '' and fails > 0 then quorum_mark = mark end
    if override_until == 0 and calls >= min_calls and calls > 0
        and NEXT[st].rates_exceeded ~= IGNORE
        and exceeded(calls, failures, slow, failure_threshold, slow_threshold) then
      local met, foreign = quorum_met(K_STATE, K_META, cfg_store, cfg_wire, quorum_mark, now)
      if foreign then return foreign end
      if met then
        fire('rates_exceeded', rates_text(calls, failures, slow, failure_threshold,
                                          slow_threshold))
      elseif quorum_mark then
        -- quorum pending: only a record carrying this worker's own failures says so
        -- (its worker may then open its own view, judged on its own outcomes); a
        -- healthy worker's record changes nothing for it
        quorum_blocked = true
      end
    end
  elseif st == 'HALF_OPEN' and token ~= '' and holds_lease(token) then
    -- the lease goes; an ignored probe (all zero) thereby hands its slot back
    probe_rem = token
    hp_done, hp_fail, hp_slow = hp_done + ok + fails, hp_fail + fails, hp_slow + slows
    dirty_half_open = true
    if ok + fails > 0 then  -- the cumulative counters are in the state group
      calls_total, failures_total = calls_total + ok + fails, failures_total + fails
      dirty_state = true
    end
    if slows > 0 then
      local g = cold()
      g.slow_total, dirty_counters = g.slow_total + slows, true
    end
    if hp_done >= probes_max then
      if exceeded(hp_done, hp_fail, hp_slow, failure_threshold, slow_threshold) then
        fire('probes_failed', 'half-open probes: '
             .. rates_text(hp_done, hp_fail, hp_slow, failure_threshold, slow_threshold))
      else
        fire('probes_succeeded')
      end
    end
  end
  return nil
end

local function op_acquire()
  local token = argv[6]
  if not token or token == '' then return args_error('acquire needs a probe token') end
  advance()
  local st = s_state
  if st == 'OPEN' or st == 'FORCED_OPEN' then
    permitted = 0
  elseif st == 'HALF_OPEN' then
    -- A token that already holds a live lease (a retried acquire) counts among the
    -- live ones: with a free slot its lease is renewed (ZADD of the same member, no
    -- second slot); without one it stands as it is.
    if live_probes() + hp_done < probes_max then
      probe_add = token
    elseif not holds_lease(token) then
      permitted = 0
    end
  end
  if permitted == 0 then
    local g = cold()
    g.rejected, dirty_counters = g.rejected + 1, true
  end
  return nil
end


local function op_set()
  local g = cold()
  local target, reason, actor = argv[6], argv[7], argv[8]
  local hold, bad = hold_from(now, argv[9] or '', argv[10] or '', target)
  if not hold then return bad end
  if not (target == 'RESET' or target == 'TRIP' or target == 'ADOPT' or (CODE[target]
          and target ~= 'OPEN' and target ~= 'HALF_OPEN')) then
    return args_error('unknown target state ' .. tostring(target))
  end
  advance()
  if target == 'ADOPT' then
    -- `config adopt`: settle_config adopted the caller's config (or it was in force)
    return nil
  elseif target == 'RESET' then
    if fire('reset', reason, actor) == CLEAR then
      -- a CLOSED breaker: recorded (kind 'reset') when it changes anything: a window
      -- emptied, a held CLOSED released, a drift record cleared, a config adopted
      if reset_changes(calls, override_until, clear_drift, meta_cfg) then
        reason_now, actor_now, meta_reason = reason, actor, true
        note('reset', reason, actor, 0)
      end
      clear_window()
      clear_probes = true
      if override_until > 0 then override_until, dirty_state = 0, true end
    end
  elseif target == 'TRIP' then
    local to = fire('trip', reason, actor)
    if to == RESTART then
      -- a same-state move: the wait restarts, recorded as a restart, not a transition
      reason_now, actor_now, meta_reason, dirty_counters = reason, actor, true, true
      g.open_until = now + wait_in_open(g, ttl_ms, micros)
      if hold > 0 then g.open_until = hold end
      note('restart', reason, actor, hold)
    elseif to ~= IGNORE and hold > 0 then
      g.open_until = hold; events[#events][9] = hold
    end
  elseif s_state ~= target then  -- `force` (not in the table): any state to the target
    transition(target, reason, actor)
    if hold > 0 then override_until = hold; events[#events][9] = hold end
  elseif hold ~= override_until then
    override_until, dirty_state, meta_reason = hold, true, true
    reason_now, actor_now = reason, actor
    note('override', reason, actor, hold)
  end
  return nil
end

-- Persisting (the bytes and writes: lua/lib/breaker_persist.lua) ------------------------
local header_state, header_counters = breaker_persist.header_state,
                                      breaker_persist.header_counters
local header_config, header_half_open = breaker_persist.header_config,
                                        breaker_persist.header_half_open

-- The first write goes through pcall: if Redis refuses it (OOM, ACL), nothing was
-- written. Returns the refusal, or nil.
local first_write = true
-- One SETRANGE of the record; the first of a call goes through pcall. Returns why
-- Redis refused it, or nil.
local function put(offset, bytes)
  if first_write and not undo_bit then
    first_write = false
    local ok = pcall_('SETRANGE', K_STATE, offset, bytes)
    if type(ok) == 'table' and ok.err then return ok.err end
    return nil
  end
  rcall('SETRANGE', K_STATE, offset, bytes)
  return nil
end

-- A probe's record: the half-open figures and the state group in one write, with the
-- config bytes between them (unchanged: no dirty_config) as this call read them.
-- true and the refusal (nil: written), or false when the groups go separately.
local function write_probe_record()
  if not (ONE_HOT_WRITE and not dirty_counters and (dirty_state or dirty_window
          or ttl_refreshed_at == now) and type(hot_raw) == 'string' and #hot_raw >= HOT_BYTES) then
    return false
  end
  seq = seq - seq % 4294967296 + (seq + 1) % 4294967296
  local refused = put(HOT_AT, header_half_open(hp_done, hp_fail, hp_slow)
                      .. sub(hot_raw, HALF_OPEN_BYTES + 1, STATE_FROM_HOT)
                      .. header_state(CODE[s_state], since, override_until, ttl_refreshed_at,
                                      calls, failures, slow, total_ms, head, window_sec, seq,
                                      calls_total, failures_total))
  if refused then return true, refused end
  write_window(K_STATE, clear_ring, window_type, window_size, time_slot_at, time_slot_values,
               n_count_slots, count_slots_from, count_slot_values)
  return true, nil
end

local function write_record()
  first_write = true
  if not exists then
    -- a new record: written whole, in one SETRANGE at its full length (the header
    -- groups are contiguous from byte 0; zeros up to the window, the empty window),
    -- so Redis allocates the string exactly (grown piece by piece it over-allocates)
    seq = seq - seq % 4294967296 + (seq + 1) % 4294967296  -- (bit 32: shadows; see feed)
    if rcall('EXISTS', K_STATE .. ':shadow') == 1 then seq = seq % 4294967296 + 4294967296 end
    local refused = put(layout.COUNTERS_AT, header_counters(cold()) .. header_config(
      cold(), hp_done, hp_fail, hp_slow, probes_max, lease_ms, max_half_open, fp, window_type,
      window_size, min_calls, failure_threshold, slow_threshold, ttl_ms)
      .. header_state(CODE[s_state], since, override_until, ttl_refreshed_at, calls, failures,
                      slow, total_ms, head, window_sec, seq, calls_total or 0,
                      failures_total or 0)
      .. HEADER_PAD .. window_empty(window_type, window_size))
    if refused then return refused end
  elseif dirty_config then
    local refused = put(layout.CONFIG_AT, header_config(
      cold(), hp_done, hp_fail, hp_slow, probes_max, lease_ms, max_half_open, fp, window_type,
      window_size, min_calls, failure_threshold, slow_threshold, ttl_ms))
    if refused then return refused end
  elseif dirty_half_open then
    local combined, refused = write_probe_record()
    if combined then return refused end
    refused = put(layout.HALF_OPEN_AT, header_half_open(hp_done, hp_fail, hp_slow))
    if refused then return refused end
  end
  if exists and dirty_counters then
    local refused = put(layout.COUNTERS_AT, header_counters(cold()))
    if refused then return refused end
  end
  if exists and (dirty_state or dirty_window or ttl_refreshed_at == now) then
    seq = seq - seq % 4294967296 + (seq + 1) % 4294967296
    local refused = put(STATE_AT, header_state(CODE[s_state], since, override_until,
                                               ttl_refreshed_at, calls, failures, slow,
                                               total_ms, head, window_sec, seq,
                                               calls_total, failures_total))
    if refused then return refused end
  end
  write_window(K_STATE, clear_ring and exists, window_type, window_size, time_slot_at,
               time_slot_values, n_count_slots, count_slots_from, count_slot_values)
  return nil
end

local function reply_full(event_errors, wait_ms, in_flight)
  local rejected = cold().rejected
  -- Reason and actor explain rejections and states; a permitted acquire or record
  -- without a transition in CLOSED or HALF_OPEN answers them empty (one read less).
  if permitted == 1 and not transitions and (op == 'acquire' or op == 'record')
      and (s_state == 'HALF_OPEN' or s_state == 'CLOSED') then
    reason_now, actor_now = reason_now or '', actor_now or ''
  end
  load_reason()
  local stored = ''
  if drift == 1 then stored = rcall('HGET', K_META, 'cfg') or '' end
  local tr = transitions or {}
  if s_state == 'HALF_OPEN' or (s_state == 'OPEN' and hp_done > 0) then
    return {s_state, wait_ms, permitted, tr, hp_done, hp_fail, hp_slow, 0, rejected, drift,
            stored, now, since, in_flight, reason_now, actor_now, event_errors, override_until, 1,
            quorum_blocked and 1 or 0}
  end
  return {s_state, wait_ms, permitted, tr, calls, failures, slow, total_ms, rejected, drift,
          stored, now, since, 0, reason_now, actor_now, event_errors, override_until, 0,
          quorum_blocked and 1 or 0}
end

-- The full reply's wait_ms and probes_in_flight.
local function reply_numbers()
  local g = cold()
  local wait_ms, in_flight = 0, 0
  if s_state == 'OPEN' then
    wait_ms = max(0, g.open_until - now)
  elseif s_state == 'HALF_OPEN' then
    in_flight = live_probes() + (probe_add and 1 or 0) - (probe_rem and 1 or 0)
    in_flight = max(0, in_flight)
    if permitted == 0 and not clear_probes then
      local first = rcall('ZRANGEBYSCORE', K_PROBES, '(' .. now, '+inf', 'WITHSCORES',
                          'LIMIT', 0, 1)
      if first[2] then wait_ms = min(g.open_wait, max(0, tonumber(first[2]) - now)) end
    end
  end
  return wait_ms, in_flight
end

-- Whether quorum marks may exist to clear with the window: the caller's config asks
-- for a quorum (config field 20 > 1), or another config governed or was stored (drift,
-- adopted this call: a stored one may have). Else no client sends marks, and the DEL
-- is spared (a window restarts after every idle gap of a TIME window's length).
local QUORUM_OF, QUORUM_N = {}, 0  -- wire string -> needed workers (a library keeps them)
local function quorum_possible()
  if drift == 1 or cfg_store or meta_drift then return true end
  local needed = QUORUM_OF[cfg_wire]
  if not needed then
    needed = tonumber(breaker_config.field(cfg_wire, 20) or '') or 1
    if QUORUM_N >= 64 then QUORUM_OF, QUORUM_N = {}, 0 end
    QUORUM_OF[cfg_wire], QUORUM_N = needed, QUORUM_N + 1
  end
  return needed > 1
end

-- The meta hash (after the state record).
local function write_meta()
  if meta_reason or meta_cfg or meta_drift or clear_drift then
    breaker_persist.write_meta(K_META, meta_reason, reason_now, actor_now, meta_cfg, cfg_store,
                               meta_drift, cfg_wire, now, clear_drift)
  end
end

-- Quorum marks, probes and TTLs (after the state record and the meta hash).
local function write_others(refresh)
  if rollout_writes or adopted_why then
    breaker_rollout.write(K_META, derived.cfgs, rollout_writes, adopted_why,
                          op == 'set' and argv[8] or '',
                          int(fp), cfg_wire, adopted_deploy, now, ttl_ms)
  elseif rehello_due then
    breaker_rollout.rehello(K_META, derived.cfgs, hello_worker, fp_text, cfg_wire, now,
                            ttl_ms)
  end
  if (clear_quorum_marks and quorum_possible()) or quorum_mark then
    breaker_persist.write_quorum_marks(K_STATE, clear_quorum_marks, quorum_mark, now, ttl_ms)
  end
  if clear_probes or probe_add or probe_rem then
    breaker_persist.write_probes(K_PROBES, clear_probes, probe_add, probe_rem, now, lease_ms)
  end
  if refresh then
    -- an override or a long OPEN wait keeps the keys for key_ttl past its end (the
    -- cold group is read for it only when OPEN); the probe leases matter only in
    -- HALF_OPEN (and an OPEN that followed it): elsewhere they were cleared, or expire
    local held = override_until
    if s_state == 'OPEN' and cold().open_until > held then held = cold().open_until end
    return breaker_persist.refresh_ttls(K_STATE, K_META,
                                        (s_state == 'HALF_OPEN' or s_state == 'OPEN')
                                        and K_PROBES, now, ttl_ms, held)
  end
  if probe_add and (live_count or 0) == 0 then rcall('PEXPIRE', K_PROBES, int(ttl_ms)) end
  -- (a stored config too: the first worker after an operator made the record creates meta)
  if meta_reason or meta_drift or meta_cfg then rcall('PEXPIRE', K_META, int(ttl_ms)) end
  return ttl_ms
end

local function finish()
  -- Every key's TTL is refreshed when the last refresh is ttl/2 old (or on any
  -- operator action), so an active breaker never expires and most calls spend
  -- nothing on TTLs; keys this call may have created get theirs at once.
  local dirty = dirty_half_open or dirty_window or dirty_state or dirty_counters or dirty_config
                or not exists
  local writes = op ~= 'state' or dirty or meta_reason or meta_drift or clear_drift or clear_probes
  local refresh = writes and (op == 'set' or now - ttl_refreshed_at >= ttl_ms / 2
                              or ttl_refreshed_at > now or not exists)
  if refresh then ttl_refreshed_at = now end
  -- Before the first write (no partial writes): the types of the keys this call
  -- writes beyond the record. The probes zset is checked by its reads instead; the
  -- quorum marks hash only when a mark is written (a quorum is configured).
  local typed = meta_reason or meta_cfg or meta_drift or clear_drift or events or op == 'set'
  local marks = quorum_mark and not clear_quorum_marks
  if typed or marks then
    local err = (typed and foreign_keys()) or (marks and foreign_type(K_STATE .. ':fw', 'hash'))
    if err then
      if undo_bit then rcall('BITFIELD', K_STATE, 'SET', 'u32', undo_bit, int(undo_value)) end
      return err
    end
  end
  if dirty or refresh then
    local refused = write_record()
    if refused then
      if op == 'acquire' and permitted == 0 then
        -- A rejection stands without its counter (and without a time-driven
        -- transition it computed: the next call computes it again).
        local g = cold()
        g.rejected = g.rejected - 1
        local wait_ms, in_flight = reply_numbers()
        return reply_full('state not saved: ' .. refused, wait_ms, in_flight)
      end
      return redis.error_reply(refused)
    end
  end
  write_meta()
  local wait_ms, in_flight = 0, 0
  local short = (op == 'record' or op == 'acquire') and permitted == 1 and not transitions
      and not quorum_blocked
      and drift == 0 and override_until == 0 and s_state ~= 'OPEN' and s_state ~= 'FORCED_OPEN'
  -- outcome recording (lua/lib/breaker_sample.lua): a sampled record; a hello learns
  -- the run-time switch from the full reply (element 21)
  if op == 'record' and argv[12] then
    breaker_sample.add(K_STATE, argv[12], now, argv[7], argv[8], argv[9], argv[10], s_state)
  end
  local rec_on = hello_worker and not hello_bye and op ~= 'state' and op ~= 'set'
                 and breaker_sample.control(K_STATE)
  if rec_on then short = false end
  if not short then wait_ms, in_flight = reply_numbers() end
  local keep = write_others(refresh)
  local event_errors = ''
  if events then event_errors = breaker_events.publish(events, K_HIST, channel, name, now) end
  -- after the XADD (a first event creates the stream), once per call
  if events or refresh then pcall_('PEXPIRE', K_HIST, keep) end
  if short and event_errors == '' then return {s_state, now, since} end
  local full = reply_full(event_errors, wait_ms, in_flight)
  if rec_on then full[21] = rec_on end
  return full
end

-- Adopting or comparing configs --------------------------------------------------

-- The caller's config replaces the stored one (a rollout's rule, or an operator's
-- `config adopt`): thresholds, waits and probes take effect at once and keep the
-- window; a new window shape (type or size) starts a new window; the state stays.
local function adopt_config(why, deploy)
  local g = cold()
  local old_type, old_size = window_type, window_size
  if not parse_config(cfg_wire) then
    return redis.error_reply('DISTBREAKER_ARGS bad config ' .. cfg_wire)
  end
  fp, dirty_config, meta_cfg, cfg_store = fingerprint(cfg_wire), true, true, cfg_wire
  if window_type ~= old_type or window_size ~= old_size then
    clear_window()
    dirty_counters = true
  end
  if g.drift_fp ~= 0 then g.drift_fp, dirty_counters, clear_drift = 0, true, true end
  adopted_why, adopted_deploy = why, deploy
  return nil
end

-- A worker's hello (ARGV[2] '<fp>@<worker>'): registers it in the rollout hash and
-- answers why its config `mine` replaces the stored one `stored` (nil: it does not),
-- or nil and an error reply.
local function say_hello(mine, stored, stored_wire)
  local writes, why, err = breaker_rollout.hello(K_META, derived.cfgs, hello_worker, hello_bye,
                                                 mine, cfg_wire, stored, stored_wire, now)
  if err then return nil, foreign_keys() or schema_error(K_META, 'is not a hash') end
  rollout_writes = writes
  return why, nil
end

-- After `load`: decides which config governs and what to store.
-- A worker's hello when its config is the one in force: it decides nothing, so it is
-- made after the state record (`rehello_due`, in write_others: one HSET, usually).
local function hello_in_force()
  if hello_worker then rehello_due = true end
  return nil
end

local function settle_config()
  if hello_bye then  -- a worker leaves: it no longer runs its config
    local _, err = say_hello(arg_fp_text, '0', nil)
    return err
  end
  local adopt = (op == 'set' and argv[6] == 'RESET')
  local operator_adopt = (op == 'set' and argv[6] == 'ADOPT')
  if not exists then
    s_state, since = 'CLOSED', now
    calls, failures, slow, total_ms, head, window_sec = 0, 0, 0, 0, 0, 0
    ttl_refreshed_at, override_until = 0, 0
    if op == 'set' then
      -- An operator action on a name without keys stores no config (fp 0): the
      -- first worker's call stores its own (no drift warning for it), and the
      -- breaker starts in the config's initial state.
      fp, dirty_config = 0, true
    else
      fp, dirty_config, meta_cfg, cfg_store = fingerprint(cfg_wire), true, true, cfg_wire
      if parsed.initial_state ~= 'CLOSED' then
        s_state, reason_now, actor_now, meta_reason = parsed.initial_state, 'initial state', '',
                                                      true
      end
      if hello_worker then
        local _, err = say_hello(int(fp), int(fp), cfg_wire)
        if err then return err end
        adopted_why = 'first config'
      end
    end
    return
  end
  if fp == 0 then
    -- unset: the caller's config governs this call; only a protected call stores it
    if op == 'acquire' or op == 'record' then
      fp, dirty_config, meta_cfg, cfg_store = fingerprint(cfg_wire), true, true, cfg_wire
      if hello_worker then
        local _, err = say_hello(int(fp), int(fp), cfg_wire)
        if err then return err end
        adopted_why = 'first config'
      end
    end
    return
  end
  -- the usual call: the same config (compared as the decimal string the caller sent;
  -- the last fingerprint's text is kept across calls)
  if fp ~= fp_compared then fp_compared, fp_text = fp, int(fp) end
  if fp_text == arg_fp_text and not adopt and not operator_adopt then
    return hello_in_force()
  end
  local mine = fingerprint(cfg_wire)
  local g = cold()
  if adopt then
    if mine ~= fp then
      if not parse_config(cfg_wire) then
        return redis.error_reply('DISTBREAKER_ARGS bad config ' .. cfg_wire)
      end
      fp, dirty_config, meta_cfg, cfg_store = mine, true, true, cfg_wire
      -- the stored config changed: its window geometry may have, so start afresh
      clear_window()
      dirty_counters = true
      adopted_why, adopted_deploy = 'reset', true  -- recorded in the rollout hash
    end
    if g.drift_fp ~= 0 then g.drift_fp, dirty_counters, clear_drift = 0, true, true end
    return
  end
  if operator_adopt then
    if mine == fp then return nil end
    return adopt_config('operator', true)
  end
  if mine == fp then  -- the caller's fingerprint was wrong, not its config
    return hello_in_force()
  end
  if hello_worker then  -- (the stored wire: the meta hash's `cfg`, read with the rollout)
    local why, err = say_hello(int(mine), fp_text, nil)
    if err then return err end
    if why then return adopt_config(why, false) end
  end
  drift = 1
  if g.drift_fp ~= mine then g.drift_fp, dirty_counters, meta_drift = mine, true, true end
end

local server_time = breaker_hot.server_time  -- the server time in ms, and its microseconds

local function begin(keys, args, given_now, given_micros)
  -- KEYS[2..4] may be left out: they are the state key plus ':meta', ':probes',
  -- ':events' (fewer arguments per call; every key shares the name's hash tag)
  K_STATE = keys[1]
  local d = derived
  if K_STATE ~= d.state then
    d.state, d.meta, d.probes, d.hist = K_STATE, K_STATE .. ':meta', K_STATE .. ':probes',
                                        K_STATE .. ':events'
    d.cfgs = K_STATE .. ':cfgs'  -- the legacy rollout hash (lua/lib/breaker_rollout.lua)
  end
  K_META = keys[2] or d.meta
  K_PROBES = keys[3] or d.probes
  K_HIST = keys[4] or d.hist
  argv = args
  op, cfg_wire, name, channel = args[1], args[3], args[4], args[5]
  arg_fp_text = args[2] or ''
  -- a hello is longer than any fingerprint (48 bits: at most 15 digits); rare
  shadow_feed, shadow_decl = nil, nil
  if #arg_fp_text > 15 then
    arg_fp_text, shadow_decl = breaker_shadow.split_hello(arg_fp_text)
    arg_fp_text, hello_worker, hello_bye = breaker_rollout.split(arg_fp_text)
  elseif hello_worker then
    hello_worker, hello_bye = nil, false
  end
  if rollout_writes or adopted_why or rehello_due then
    rollout_writes, adopted_why, adopted_deploy, rehello_due = nil, nil, nil, nil
  end
  if given_now then  -- a merged call (lua/finish.lua) read TIME once for all its calls
    now, micros = given_now, given_micros
  else
    now, micros = server_time()
  end
  cold_group, parsed, reason_now, actor_now, cfg_store, drift, permitted = nil, nil, nil, nil,
                                                                            nil, 0, 1
  dirty_half_open, dirty_window, dirty_state, dirty_counters, dirty_config = false, false, false,
                                                                             false, false
  meta_reason, meta_cfg, meta_drift, clear_drift = false, false, false, false
  clear_ring, n_count_slots, time_slot_at, time_slot_values = false, 0, nil, nil
  clear_probes, probe_add, probe_rem, live_count = false, nil, nil, nil
  undo_bit, undo_value = nil, nil
  transitions, events, quorum_mark, quorum_blocked, clear_quorum_marks = nil, nil, nil, nil, false
end

-- The hot path (lua/lib/breaker_hot.lua): the usual CLOSED record, in its own locals.
local fast_record = breaker_hot.record

return function(KEYS, ARGV, given_now, given_micros)
  preread = nil
  if ARGV[3] == nil and ARGV[2] ~= nil then  -- the compact record: done, or 0
    preread = nil                             -- ("send the full form")
    return fast_record(KEYS, ARGV, given_now, given_micros, true) or 0
  end
  if ARGV[1] == 'record' then
    local fast
    fast, preread, given_now, given_micros = fast_record(KEYS, ARGV, given_now, given_micros)
    if fast then
      if ARGV[12] then  -- a sampled outcome (lua/lib/breaker_sample.lua)
        breaker_sample.add(KEYS[1], ARGV[12], fast[2], ARGV[7], ARGV[8], ARGV[9], ARGV[10],
                           'CLOSED')
      end
      return fast
    end
  end
  if ARGV[1] == 'shadow' then return breaker_shadow.op(KEYS, ARGV) end
  begin(KEYS, ARGV, given_now, given_micros)
  if op ~= 'acquire' and op ~= 'record' and op ~= 'state' and op ~= 'set' then
    return args_error('unknown op ' .. tostring(op))
  end
  local err = load()
  if err then return err end
  if op == 'state' then
    -- a read (operators, metrics) touches few keys: still name foreign data in any
    err = foreign_keys()
    if err then return err end
  end
  if not exists and op == 'state' then
    return {parsed.initial_state, 0, 1, {}, 0, 0, 0, 0, 0, 0, '', now, now, 0}
  end
  err = settle_config()
  if err then return err end
  if op == 'record' then
    err = op_record()
  elseif op == 'acquire' then
    err = op_acquire()
  elseif op == 'set' then
    err = op_set()
  else
    advance()
  end
  if err then return err end
  if not (shadow_feed or shadow_decl) then return finish() end
  local reply = finish()
  if not reply.err then  -- shadow configs, after the state (rule 10)
    if shadow_feed then pcall(breaker_shadow.feed, K_STATE, now, micros, unpack(shadow_feed)) end
    if shadow_decl then pcall(breaker_shadow.declare, K_STATE, shadow_decl, now) end
  end
  return reply
end
