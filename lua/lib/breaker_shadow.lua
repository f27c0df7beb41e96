--!lib needs prelude record_layout record_codec breaker_config breaker_transitions breaker_window breaker_ops
-- Shadow configs (docs/guides/shadow.md, docs/KEY_SCHEMA.md "Shadow configs"): up to
-- MAX named candidate configs of a breaker, fed the same live outcomes in the same
-- script call, each with its own window and state machine (the live breaker's table,
-- lua/lib/breaker_transitions.lua; its window arithmetic, lua/lib/breaker_window.lua;
-- its open wait, lua/lib/breaker_ops.lua), recording what it WOULD have done: its
-- transitions, the calls it would have rejected and the failures that would thereby
-- have been avoided. A shadow never changes admission: nothing here is read by the
-- live state machine.
--
-- The hot path pays nothing for the feature: the live record's `seq` field carries
-- bit 32 (SHADOWED) while shadows exist, and lua/breaker.lua / lua/lib/breaker_hot.lua
-- call `feed` only when they read that bit (they read `seq` anyway). A breaker's
-- shadows are one hash, <state key>:shadow (a shadow is a slot 1..MAX):
--   c<slot>  "<until ms>|<name>|<config wire>|<set at ms>|<source>|<actor>|<reason>"
--            (until 0: no end; source: operator or declared)
--   s<slot>  what transitions and would-be rejections change: COLD_N i8 (below)
-- plus one string per shadow, <state key>:shadow:w<slot>: its header (HOT_N i8 from
-- byte 0, what every record changes) and its window from byte WINDOW_AT, in the live
-- record's slot format, so breaker_window's functions run on it. A count window's head
-- is its `seen` modulo its size (a window restarts empty wherever that points), so a
-- record that changes no count changes only `seen` and one slot. The `seen` field holds
-- epoch * SPAN + seen: its epoch (1..EPOCHS) changes whenever the breaker's set of
-- shadows does (a shadow set, replaced or added), which tells a mirror (below) it went
-- stale.
--
-- The usual record (one outcome, every shadow CLOSED with a count window, no trip)
-- costs one BITFIELD per shadow, INCRBY of `seen` and SET of its slot (and SETs of the
-- counts it changes): a library (FCALL) keeps a mirror of each shadowed breaker's
-- headers, windows and configs, so it knows the slot to write, the outcome that leaves
-- it and the new counts before it sends anything. The INCRBY checks the mirror in the
-- same command (every writer adds to `seen`; a new shadow changes the others' epoch): a
-- stale mirror's writes are undone from the old values the command answered, and the
-- general path runs. Under EVAL (the PHP client) nothing outlives a call: the general
-- path always runs.
-- Its history: the stream <state key>:shadow:events (MAXLEN ~ 1000), every entry
-- naming its shadow. All keys share the name's hash tag; their TTL is the candidates'
-- longest key TTL, refreshed by the feed (at most every TTL / 2).
local floor, min, max, tonumber, tostring = math.floor, math.min, math.max, tonumber, tostring
local sub, match, find, rep, gmatch = string.sub, string.match, string.find, string.rep,
                                      string.gmatch
local rcall, pcall_, unpack = redis.call, redis.pcall, unpack
local layout, packer = record_layout, record_codec.packer
local decode, encode, int = record_codec.decode, record_codec.encode, record_codec.int
local NEXT, AFTER_HALF_OPEN = breaker_transitions.NEXT, breaker_transitions.AFTER_HALF_OPEN
local REASON = breaker_transitions.REASON
local exceeded, rate, describe = breaker_window.exceeded, breaker_window.rate,
                                 breaker_window.describe
local evicted, record_one, record_many = breaker_window.evicted, breaker_window.record_one,
                                         breaker_window.record_many
local advance_time = breaker_window.advance_time
local PRESENT, FAILED, SLOW, MS_MASK = layout.PRESENT, layout.FAILED, layout.SLOW,
                                       layout.MS_MASK
local window_write = breaker_window.write
local WIN, COUNT_SLOT = layout.WINDOW_AT, layout.COUNT_SLOT_BYTES
local wait_in_open = breaker_ops.wait_in_open
local args_error, foreign_type = prelude.args_error, prelude.foreign_type

local MAX = 3                       -- shadows per breaker
local SHADOWED = 4294967296         -- bit 32 of the live record's `seq`
local DECLARED_LEASE = 60000        -- a declared shadow lives this long past a hello
local SEQ_AT = tonumber(layout.HOT_AT) + layout.HOT_LOW_BYTE.seq - 8  -- its first byte
local STATES = {'CLOSED', 'OPEN', 'HALF_OPEN'}
local CODE = {CLOSED = 0, OPEN = 1, HALF_OPEN = 2}
-- the ring's header, what every record writes (i8 each, from byte 0):
--   code calls failures slow total_ms head wsec seen seen_failures ttl_at
-- (total_ms: kept 0, nothing reads it; head: seen % window size; seen: with its epoch)
-- s<slot>, what only a transition or a would-be rejection writes (i8 each):
--   since open_until opens hp_done hp_fail hp_slow started trips rejected avoided
--   open_ms ep_at ep_rejected ep_avoided ep_ms
-- (ep_*: the last episode, from a trip out of CLOSED back to CLOSED: its start, the
-- calls it would have rejected, the failures among them, its length once over, 0 while
-- it runs)
local HOT_N, COLD_N = 10, 15
local HDR_FORMAT, COLD_FORMAT = '>' .. rep('i8', HOT_N), '>' .. rep('i8', COLD_N)
local HDR_LAST = tostring(8 * HOT_N - 1)
local SPAN, EPOCHS = 1099511627776, 8191  -- 2^40; epochs * SPAN < 2^53 (a Lua number)
local HOT = {'code', 'calls', 'failures', 'slow', 'total_ms', 'head', 'wsec', 'seen',
             'seen_failures', 'ttl_at'}
local COLD = {'since', 'open_until', 'opens', 'hp_done', 'hp_fail', 'hp_slow', 'started',
              'trips', 'rejected', 'avoided', 'open_ms', 'ep_at', 'ep_rejected', 'ep_avoided',
              'ep_ms'}

local function pack(format, n, ...)
  if packer then return packer.pack(format, ...) end
  return encode({...}, 1, n, 8)
end

-- A shadow's state as a table (the general path: transitions, OPEN, HALF_OPEN, TIME).
local function unpack_state(hot, cold_bytes)
  local st, h, c = {}, decode(hot or '', HOT_N, 8), decode(cold_bytes or '', COLD_N, 8)
  for i, f in ipairs(HOT) do st[f] = h[i] end
  for i, f in ipairs(COLD) do st[f] = c[i] end
  st.epoch = st.seen - st.seen % SPAN
  st.seen = st.seen - st.epoch
  return st
end

local function pack_hot(st)
  return pack(HDR_FORMAT, HOT_N, st.code, st.calls, st.failures, st.slow, 0, st.head,
              st.wsec, st.epoch + st.seen, st.seen_failures, st.ttl_at)
end

local function pack_cold(st)
  return pack(COLD_FORMAT, COLD_N, st.since, st.open_until, st.opens, st.hp_done, st.hp_fail,
              st.hp_slow, st.started, st.trips, st.rejected, st.avoided, st.open_ms, st.ep_at,
              st.ep_rejected, st.ep_avoided, st.ep_ms)
end

-- The ring key of a shadow: its window at byte WINDOW_AT, in the live record's slot
-- format, so lua/lib/breaker_window.lua's functions work on it unchanged.
local function ring_key(kstate, slot) return kstate .. ':shadow:w' .. slot end

-- A ring (re)started empty, at its full length, with its TTL, and header `hdr` (the
-- header's bytes; nil: zeros, the caller writes it).
-- (its zeros made at first use: under EVAL every call runs this chunk)
local PAD, HDR_ZERO
local function new_ring(kring, c, hdr)
  if not PAD then PAD, HDR_ZERO = rep('\0', WIN - 8 * HOT_N), rep('\0', 8 * HOT_N) end
  rcall('DEL', kring)
  rcall('SETRANGE', kring, '0', (hdr or HDR_ZERO) .. PAD
                                 .. breaker_window.empty(c.window_type, c.window_size))
  rcall('PEXPIRE', kring, int(c.ttl_ms))
end

-- The next epoch (times SPAN) after the `seen` field `raw` (nil: none, from the clock).
local function next_epoch(raw)
  local e
  if raw then
    e = floor(raw / SPAN) % EPOCHS + 1
  else
    local t = rcall('TIME')
    e = tonumber(t[2]) % EPOCHS + 1
  end
  return e * SPAN
end

-- The header's bytes of a ring (its HOT_N fields).
local function read_hdr(kring)
  local raw = pcall_('GETRANGE', kring, '0', HDR_LAST)
  if type(raw) ~= 'string' then return '' end
  return raw
end

-- "<until>|<name>|<wire>|<set at>|<source>|<actor>|<reason>" parsed: the config's
-- table with `until_ms`, `name`, `wire`, `source`, kept per text (a library keeps
-- them; a few per worker).
local SPECS, N_SPECS = {}, 0
local function spec_of(text)
  local c = SPECS[text]
  if c ~= nil then return c end
  local until_ms, shadow, wire, source = match(text, '^(%d+)|([^|]*)|([^|]*)|%d*|([^|]*)|')
  c = until_ms and breaker_config.parse(wire) or false
  if c then c.until_ms, c.name, c.wire, c.source = tonumber(until_ms), shadow, wire, source end
  if N_SPECS >= 64 then SPECS, N_SPECS = {}, 0 end
  SPECS[text], N_SPECS = c, N_SPECS + 1
  return c
end

-- A transition of shadow state `st` on `event` (lua/lib/breaker_transitions.lua's
-- table); appends its history entry to `events`. Answers the events table.
local function move(st, c, event, reason, now, micros, events)
  local from = STATES[st.code + 1]
  local to = NEXT[from][event]
  if to == AFTER_HALF_OPEN then to = c.after_half_open end
  if type(to) ~= 'string' then return events end
  local fr, sr
  if from == 'HALF_OPEN' then
    fr, sr = rate(st.hp_fail, st.hp_done), rate(st.hp_slow, st.hp_done)
  else
    fr, sr = rate(st.failures, st.calls), rate(st.slow, st.calls)
  end
  st.code, st.since = CODE[to], now
  if to == 'OPEN' then
    if from == 'CLOSED' then
      st.trips, st.ep_at, st.ep_rejected, st.ep_avoided, st.ep_ms = st.trips + 1, now, 0, 0, 0
    end
    st.opens = st.opens + 1
    st.open_until = now + wait_in_open({open_wait = c.open_wait, wait_mult = c.wait_mult,
                                        wait_rnd = c.wait_rnd, max_open_wait = c.max_open_wait,
                                        opens = st.opens}, c.ttl_ms, micros)
    st.hp_done, st.hp_fail, st.hp_slow = 0, 0, 0
  elseif to == 'HALF_OPEN' then
    st.open_until, st.hp_done, st.hp_fail, st.hp_slow = 0, 0, 0, 0
  else  -- CLOSED: the episode ends, the window starts afresh
    st.ep_ms = now - st.ep_at
    st.open_ms, st.open_until, st.opens = st.open_ms + st.ep_ms, 0, 0
    st.calls, st.failures, st.slow, st.total_ms, st.wsec = 0, 0, 0, 0, 0
    st.head = st.seen % c.window_size  -- (where the emptied window restarts)
    st.clear_ring = true
  end
  events = events or {}
  events[#events + 1] = {from, to, reason or REASON[event], fr, sr, '', st.ep_ms,
                         st.ep_rejected, st.ep_avoided, st.ep_at}
  return events
end

-- The general path of one shadow fed one record: any state, any window. Answers the
-- hot and cold bytes (cold nil: unchanged) and the history entries (nil: none).
local function step(kring, c, hot, cold_bytes, now, micros, ok, fails, slows, ms)
  local st = unpack_state(hot, cold_bytes)
  if c.window_type == 0 then st.head = st.seen % c.window_size end
  local n = ok + fails
  local events
  if st.code == 1 and now >= st.open_until then
    events = move(st, c, 'wait_elapsed', nil, now, micros, events)
  end
  if st.code == 2 and c.max_half_open > 0 and now >= st.since + c.max_half_open then
    events = move(st, c, 'max_wait_elapsed', nil, now, micros, events)
  end
  if st.clear_ring then new_ring(kring, c); st.clear_ring = nil end
  if c.window_type ~= 0 then
    -- (as the live record's: lua/breaker.lua evict_time_buckets; `head` is the
    -- window's epoch, 0 in a ring an earlier version wrote)
    local sec = floor(now / 1000)
    if sec ~= st.wsec or st.head == 0 then
      local zero, plan
      zero, plan, st.calls, st.failures, st.slow, st.total_ms, st.head = advance_time(
        kring, sec, st.wsec, c.window_size, st.calls, st.failures, st.slow, st.total_ms,
        st.head)
      if zero then
        window_write(kring, true, 1, c.window_size, nil, nil, 0, 0, nil)
      end
      if plan then window_write(kring, false, 1, c.window_size, nil, plan, 0, 0, nil) end
      st.wsec = sec
    end
  end
  st.seen, st.seen_failures = st.seen + n, st.seen_failures + fails
  if st.code == 0 then
    if c.window_type == 0 then
      if n == 1 then
        local _, _, o, m = record_one(kring, st.head, fails, slows, ms)
        local dn, df, ds, dms = evicted(o or 0)
        st.calls, st.failures = st.calls + 1 - dn, st.failures + fails - df
        st.slow, st.total_ms = st.slow + slows - ds, st.total_ms + (m or 0) - dms
        st.head = (st.head + 1) % c.window_size
      else
        -- (more outcomes than slots: the first ones would be overwritten by the last)
        if n > c.window_size then st.head = (st.head + n - c.window_size) % c.window_size end
        local values, from = {}, st.head
        local k, dn, df, ds, dms
        k, st.head, dn, df, ds, dms = record_many(kring, st.head, c.window_size, ok, fails,
                                                  slows, ms, values)
        window_write(kring, false, 0, c.window_size, nil, nil, k, from, values)
        st.calls, st.failures = st.calls + dn, st.failures + df
        st.slow, st.total_ms = st.slow + ds, st.total_ms + dms
      end
    else
      st.calls, st.failures = st.calls + n, st.failures + fails
      st.slow, st.total_ms = st.slow + slows, st.total_ms + ms
    end
    if st.calls >= c.min_calls and st.calls > 0
        and exceeded(st.calls, st.failures, st.slow, c.failure_threshold, c.slow_threshold) then
      events = move(st, c, 'rates_exceeded', describe(st.calls, st.failures, st.slow,
                                                      c.failure_threshold, c.slow_threshold),
                    now, micros, events)
    end
  elseif st.code == 1 then  -- OPEN: every call would have been rejected
    st.rejected, st.avoided = st.rejected + n, st.avoided + fails
    st.ep_rejected, st.ep_avoided = st.ep_rejected + n, st.ep_avoided + fails
  else  -- HALF_OPEN: the first permitted_calls_in_half_open probe, the rest are rejected
    local take = min(n, c.probes_max - st.hp_done)
    local pf, ps = floor(fails * take / n), floor(slows * take / n)
    st.hp_done, st.hp_fail, st.hp_slow = st.hp_done + take, st.hp_fail + pf, st.hp_slow + ps
    st.rejected, st.avoided = st.rejected + n - take, st.avoided + fails - pf
    st.ep_rejected, st.ep_avoided = st.ep_rejected + n - take, st.ep_avoided + fails - pf
    if st.hp_done >= c.probes_max then
      if exceeded(st.hp_done, st.hp_fail, st.hp_slow, c.failure_threshold,
                  c.slow_threshold) then
        events = move(st, c, 'probes_failed', 'half-open probes: ' .. describe(
          st.hp_done, st.hp_fail, st.hp_slow, c.failure_threshold, c.slow_threshold),
          now, micros, events)
      else
        events = move(st, c, 'probes_succeeded', nil, now, micros, events)
      end
    end
  end
  if st.clear_ring then new_ring(kring, c) end
  local refresh = now - st.ttl_at >= c.ttl_ms / 2 or st.ttl_at > now
  if refresh then st.ttl_at = now end
  return pack_hot(st), pack_cold(st), events, refresh
end

-- The usual case, in locals: a CLOSED shadow with a count window fed one outcome that
-- does not trip it (one BITFIELD SET of its ring; only its hot state changes). nil when
-- the case is not that simple (`step` then runs, nothing of this one's done).
local function step_closed(kring, c, hot, now, fails, slows, ms)
  if c.window_type ~= 0 or not packer or #hot < 8 * HOT_N then return nil end
  local code, calls, failures, slow, total_ms, head, wsec, seen, seen_failures, ttl_at =
    packer.unpack(HDR_FORMAT, hot)
  head = seen % SPAN % c.window_size
  if code ~= 0 then return nil end
  -- a trip needs the calls to reach the minimum: judged before anything is written
  if calls + 1 >= c.min_calls and exceeded(calls + 1, failures + fails, slow + slows,
                                           c.failure_threshold, c.slow_threshold) then
    return nil
  end
  local _, _, o, m = record_one(kring, head, fails, slows, ms)
  local dn, df, ds, dms = evicted(o or 0)
  calls, failures, slow, total_ms = calls + 1 - dn, failures + fails - df, slow + slows - ds,
                                    total_ms + (m or 0) - dms
  if calls >= c.min_calls and exceeded(calls, failures, slow, c.failure_threshold,
                                       c.slow_threshold) then
    rcall('BITFIELD', kring, 'SET', 'u32', int((WIN + COUNT_SLOT * head) * 8), int(o or 0))
    return nil  -- (the slot put back: `step` records it and trips)
  end
  local refresh = now - ttl_at >= c.ttl_ms / 2 or ttl_at > now
  if refresh then ttl_at = now end
  return packer.pack(HDR_FORMAT, 0, calls, failures, slow, 0, (head + 1) % c.window_size,
                     wsec, seen + 1, seen_failures + fails, ttl_at), refresh
end

-- History entries of `shadow` (XADD through pcall: their failure undoes nothing).
local function history(kstate, shadow, events, now)
  local k = kstate .. ':shadow:events'
  for _, e in ipairs(events) do
    local entry = {'XADD', k, 'MAXLEN', '~', '1000', '*', 'shadow', shadow, 'from', e[1],
                   'to', e[2], 'reason', e[3], 'at_ms', int(now),
                   'failure_rate', tostring(e[4]), 'slow_rate', tostring(e[5])}
    if e[6] ~= '' then entry[#entry + 1] = 'kind'; entry[#entry + 1] = e[6] end
    if e[11] and e[11] ~= '' then entry[#entry + 1] = 'actor'; entry[#entry + 1] = e[11] end
    if e[12] then  -- a shadow's end: its totals
      for i = 1, #e[12], 2 do
        entry[#entry + 1] = e[12][i]; entry[#entry + 1] = int(e[12][i + 1])
      end
    end
    if e[10] and e[10] > 0 then  -- an episode: since it opened, its would-be figures
      for _, kv in ipairs({{'episode_at_ms', e[10]}, {'episode_ms', e[7]},
                           {'rejected', e[8]}, {'avoided', e[9]}}) do
        entry[#entry + 1] = kv[1]; entry[#entry + 1] = int(kv[2])
      end
    end
    pcall_(unpack(entry))
  end
end

-- The live record's SHADOWED bit, set or cleared (the record may not exist: a new one
-- gets it from lua/breaker.lua when the shadow hash exists).
local PART = {c = 1, h = 2, s = 3}

local function flag(kstate, on)
  local raw = pcall_('GETRANGE', kstate, int(SEQ_AT), int(SEQ_AT + 7))
  if type(raw) ~= 'string' or #raw < 8 then return end
  local seq = decode(raw, 1, 8)[1]
  if on and seq < SHADOWED then
    rcall('SETRANGE', kstate, int(SEQ_AT), encode({seq + SHADOWED}, 1, 1, 8))
  elseif not on and seq >= SHADOWED then
    rcall('SETRANGE', kstate, int(SEQ_AT), encode({seq - SHADOWED}, 1, 1, 8))
  end
end

-- The shadow hash's slots: {slot = {spec text, hot bytes, cold bytes, config}}, the
-- slot of each name, and the count.
local function read_all(k)
  local all = pcall_('HGETALL', k)
  if type(all) ~= 'table' or all.err then return nil, nil, 0 end
  local slots, byname, count = {}, {}, 0
  for i = 1, #all, 2 do
    local field = all[i]
    local part, slot = PART[sub(field, 1, 1)], tonumber(sub(field, 2))
    if part and slot then
      local t = slots[slot]
      if not t then t = {}; slots[slot] = t end
      t[part] = all[i + 1]
    end
  end
  for slot, t in pairs(slots) do
    t[4] = t[1] and spec_of(t[1])
    if t[4] then
      byname[t[4].name], count = slot, count + 1
      t[2] = read_hdr(k .. ':w' .. slot)
    end
  end
  return slots, byname, count
end

-- A shadow's end (expired, cleared, replaced): its fields and ring go, with a history
-- entry carrying its figures (and the open episode's, if one was running).
local function ending(kstate, slot, t, kind, reason, actor, now, dels)
  dels[#dels + 1] = 'c' .. slot
  dels[#dels + 1] = 'h' .. slot
  dels[#dels + 1] = 's' .. slot
  rcall('DEL', ring_key(kstate, slot))
  local st = unpack_state(t[2], t[3])
  local name = STATES[st.code + 1] or 'CLOSED'
  local ep = st.code ~= 0 and st.ep_at or 0
  history(kstate, t[4] and t[4].name or ('#' .. slot), {{
    name, name, reason, -1, -1, kind, ep > 0 and now - ep or 0, st.ep_rejected,
    st.ep_avoided, ep, actor, {'seen', st.seen, 'trips', st.trips, 'rejected_total',
                               st.rejected, 'avoided_total', st.avoided}}}, now)
end

local function finish_ends(kstate, k, dels, left)
  if #dels > 0 then rcall('HDEL', k, unpack(dels)) end
  if left == 0 then
    rcall('DEL', k)
    flag(kstate, false)
  end
end

-- How long a shadow's keys must live: its key TTL, or until its end if later.
local function keep_ms(c, until_ms, now)
  return max(c.ttl_ms, until_ms > 0 and until_ms - now or 0)
end

-- The keys of the last breaker fed (a worker feeds the same few: building the strings
-- costs more than comparing one).
local fed_for, fed_k, fed_rings
local COLD_FIELD = {'s1', 's2', 's3'}

-- The general feed: every shadow of the breaker whose state record is `kstate` fed one
-- record's outcomes (`ok` successes, `fails` failures, `slows` slow, `ms` in all), after
-- the live record was written: one HMGET of the slots' configs, each shadow a read of
-- its header, its window's writes and a write of its header. Shadows whose end passed go
-- here. Answers the live shadows' {slot, config, header bytes} when each is CLOSED with a
-- count window (what a mirror can hold), else nil.
local function feed_general(kstate, now, micros, ok, fails, slows, ms)
  if kstate ~= fed_for then
    fed_for, fed_k = kstate, kstate .. ':shadow'
    fed_rings = {ring_key(kstate, 1), ring_key(kstate, 2), ring_key(kstate, 3)}
  end
  local k = fed_k
  local got = pcall_('HMGET', k, 'c1', 'c2', 'c3')
  if got.err then return nil end
  local n = ok + fails
  local ended, live, keep, mirrorable = false, 0, 0, {}
  for slot = 1, MAX do
    local text_ = got[slot]
    local c = text_ and spec_of(text_)
    if c and c.until_ms > 0 and now >= c.until_ms then
      ended = true
    elseif c then
      live = live + 1
      -- one outcome: this candidate's own slowness (a batch: the client's count)
      local s = slows
      if n == 1 then s = (ms > c.slow_ms) and 1 or 0 end
      local kring = fed_rings[slot]
      local hot = read_hdr(kring)
      local refresh, cold, events = false, nil, nil
      local new_hot
      if n == 1 then new_hot, refresh = step_closed(kring, c, hot, now, fails, s, ms) end
      if not new_hot then
        new_hot, cold, events, refresh = step(kring, c, hot, rcall('HGET', k,
                                              COLD_FIELD[slot]) or '', now, micros, ok, fails,
                                              s, ms)
      end
      rcall('SETRANGE', kring, '0', new_hot)
      if cold then rcall('HSET', k, COLD_FIELD[slot], cold) end
      if events then history(kstate, c.name, events, now) end
      if refresh then
        keep = max(keep, keep_ms(c, c.until_ms, now))
        pcall_('PEXPIRE', kring, int(c.ttl_ms))
      end
      if mirrorable and c.window_type == 0 and sub(new_hot, 1, 8) == '\0\0\0\0\0\0\0\0' then
        mirrorable[#mirrorable + 1] = {slot, c, new_hot}
      else
        mirrorable = nil
      end
    elseif text_ then
      ended = true  -- a config this script cannot read: dropped below
    end
  end
  if ended or live == 0 then  -- the general way: expiries, a bad config, nothing left
    local slots, _, count = read_all(k)
    local dels, left = {}, count
    for slot, t in pairs(slots or {}) do
      local c = t[4]
      if not c then
        dels[#dels + 1] = 'c' .. slot; dels[#dels + 1] = 'h' .. slot
        dels[#dels + 1] = 's' .. slot
        if t[1] then
          history(kstate, '#' .. slot, {{'CLOSED', 'CLOSED', 'bad config', -1, -1, 'invalid',
                                         0, 0, 0, 0}}, now)
        end
      elseif c.until_ms > 0 and now >= c.until_ms then
        left = left - 1
        ending(kstate, slot, t, 'expired', 'its time ended', '', now, dels)
      end
    end
    finish_ends(kstate, k, dels, left)
    mirrorable = nil
  end
  if keep > 0 and live > 0 then
    rcall('PEXPIRE', k, int(keep))
    pcall_('PEXPIRE', kstate .. ':shadow:events', int(keep))
  end
  return mirrorable
end

-- The mirror (a library's, FCALL: nothing outlives an EVAL): per state key, its
-- shadows as they are in Redis after this library's last write, each an array (its
-- fields below, by index: the usual record reads few of them, by position; each table
-- access costs the server about a hundred instructions). Kept for MIRRORED_MAX breakers
-- (of windows up to MIRROR_SLOTS slots): when full, others are not mirrored (their
-- records go the general way) until the mirror is emptied, at most once every
-- REFILL feeds, so breakers that took turns would not make every record pay a copy. A
-- breaker whose mirror went stale is mirrored again only after COOL feeds (another
-- writer, a PHP worker say, would make every record pay the copy).
-- Its functions are made by `make_mirror` at a library's second feed: under EVAL every
-- call runs this chunk (and feeds once), and each closure made costs in proportion to
-- the chunk's locals it captures.
local function make_mirror(layout_, codec)
  local rcall, min, rep, unpack = redis.call, math.min, string.rep, unpack
  local int, decode, packer = codec.int, codec.decode, codec.packer
  local WIN, COUNT_SLOT = layout_.WINDOW_AT, layout_.COUNT_SLOT_BYTES
  local PRESENT, FAILED, SLOW, MS_MASK = layout_.PRESENT, layout_.FAILED, layout_.SLOW,
                                         layout_.MS_MASK
  local SPAN, HDR_FORMAT = 1099511627776, '>' .. rep('i8', 10)  -- (as this module's)
  local M_KRING, M_RING, M_VER, M_CALLS, M_FAILS, M_SLOW, M_SEEN_F, M_TTL_AT = 1, 2, 3, 4, 5, 6,
                                                                            7, 8
  -- (M_DEADLINE: its end or its next TTL refresh, whichever comes first)
  local M_SIZE, M_DEADLINE, M_SLOW_MS, M_MIN, M_FT, M_ST, M_BIT, M_R = 9, 10, 11, 12, 13, 14,
                                                                       15, 16
  local MIRROR, N_MIRROR, MIRRORED_MAX, MIRROR_SLOTS, COOL = {}, 0, 256, 1000, 16
  local REFILL, emptied_at = 100000, 0
  local COOLING, N_COOLING = {}, 0
  local BIT = {}    -- a count slot's bit offset (a string), by slot
  local VALUE, N_VALUE = {}, 0  -- a slot's value as a string, by value (a few hundred)
  local F_CALLS, F_FAILS, F_SLOW, F_SEEN, F_SEEN_F = '64', '128', '192', '448', '512'
  local CHUNK, CHUNK_FORMAT = 200, nil  -- (made at the first mirror)

  -- Mirrors the shadows `list` ({slot, config, header bytes} each, all CLOSED with count
  -- windows) of `kstate`: each window read once (the header just written is given;
  -- `feeds`: the library's feeds so far).
  local function mirror(kstate, list, feeds)
    if N_MIRROR >= MIRRORED_MAX then
      if feeds - emptied_at < REFILL then return end
      MIRROR, N_MIRROR, emptied_at = {}, 0, feeds
    end
    local m = {}
    for i, e in ipairs(list) do
      local c = e[2]
      local size = c.window_size
      if size > MIRROR_SLOTS or not packer then return end
      local _, calls, failures, slow, _, _, _, ver, seen_failures, ttl_at =
        packer.unpack(HDR_FORMAT, e[3])
      if ver < SPAN then return end  -- (a ring of an older layout: never mirrored)
      local kring = kstate .. ':shadow:w' .. e[1]
      local raw = rcall('GETRANGE', kring, int(WIN), int(WIN + COUNT_SLOT * size - 1))
      if #raw < COUNT_SLOT * size then return end
      local ring, at = {}, 0
      CHUNK_FORMAT = CHUNK_FORMAT or '>' .. rep('I4', CHUNK)
      while at < size do
        local take = min(CHUNK, size - at)
        local v = take == CHUNK and {packer.unpack(CHUNK_FORMAT, raw, COUNT_SLOT * at + 1)}
                  or decode(raw, take, COUNT_SLOT, COUNT_SLOT * at + 1)
        for j = 1, take do ring[at + j - 1] = v[j] end
        at = at + take
      end
      local deadline = ttl_at + c.ttl_ms / 2
      if c.until_ms > 0 then deadline = min(deadline, c.until_ms) end
      m[i] = {kring, ring, ver, calls, failures, slow, seen_failures, ttl_at, size, deadline,
              c.slow_ms, c.min_calls, c.failure_threshold, c.slow_threshold, false, false}
    end
    if not MIRROR[kstate] then N_MIRROR = N_MIRROR + 1 end
    MIRROR[kstate] = m
  end

  -- A ring's value as a string (a few hundred kept: slots repeat their values).
  local function value_text(v)
    if N_VALUE >= 256 then VALUE, N_VALUE = {}, 0 end
    local vs = int(v)
    VALUE[v], N_VALUE = vs, N_VALUE + 1
    return vs
  end

  local function bit_of(head)
    local bit = int((WIN + COUNT_SLOT * head) * 8)
    BIT[head] = bit
    return bit
  end

  -- Undoes a fast write of shadow `e` (at bit offset `bit`) from the old values its
  -- BITFIELD answered (`r`: `seen`, the slot, then the counts when it set them); a ring
  -- the command created (it was gone: `seen` read 1) deleted.
  local function undo(e, bit, r)
    local kring = e[M_KRING]
    if r[1] == 1 then
      rcall('DEL', kring)
      return
    end
    local back = {'INCRBY', 'i64', F_SEEN, '-1', 'SET', 'u32', bit, int(r[2])}
    local fields = {F_CALLS, F_FAILS, F_SLOW, F_SEEN_F}
    for j = 3, #r do
      back[#back + 1] = 'SET'; back[#back + 1] = 'i64'; back[#back + 1] = fields[j - 2]
      back[#back + 1] = int(r[j])
    end
    rcall('BITFIELD', kring, unpack(back))
  end

  -- The writes of the shadows before the `k`th undone (a later one could not be fed:
  -- the mirror is dropped).
  local function undo_before(m, k)
    for j = k - 1, 1, -1 do undo(m[j], m[j][M_BIT], m[j][M_R]) end
  end

  -- A record whose outcome changes shadow `e`'s counts (a failure, or an evicted outcome
  -- of another kind; `o` the evicted slot's value, `v` the new one, `s` its slowness):
  -- its trip judged (nil: it would trip, nothing written), then one BITFIELD that sets
  -- the counts too. Answers the BITFIELD's answers and the new counts.
  local function write_counts(e, bit, o, v, s, fails)
    local calls, failures, slow = e[M_CALLS] + 1, e[M_FAILS] + fails, e[M_SLOW] + s
    if o >= PRESENT then  -- (breaker_window.evicted, inline)
      calls, o = calls - 1, o - PRESENT
      if o >= FAILED then failures, o = failures - 1, o - FAILED end
      if o >= SLOW then slow = slow - 1 end
    end
    if calls >= e[M_MIN] and (failures * 1000000 >= e[M_FT] * calls
                              or slow * 1000000 >= e[M_ST] * calls) then
      return nil
    end
    local vs = VALUE[v] or value_text(v)
    local r
    if fails > 0 then
      r = rcall('BITFIELD', e[M_KRING], 'INCRBY', 'i64', F_SEEN, '1', 'SET', 'u32', bit, vs,
                'SET', 'i64', F_CALLS, int(calls), 'SET', 'i64', F_FAILS, int(failures),
                'SET', 'i64', F_SLOW, int(slow), 'SET', 'i64', F_SEEN_F,
                int(e[M_SEEN_F] + fails))
    else
      r = rcall('BITFIELD', e[M_KRING], 'INCRBY', 'i64', F_SEEN, '1', 'SET', 'u32', bit, vs,
                'SET', 'i64', F_CALLS, int(calls), 'SET', 'i64', F_FAILS, int(failures),
                'SET', 'i64', F_SLOW, int(slow))
    end
    return r, calls, failures, slow
  end

  -- The usual record from the mirror `m`: one outcome, every shadow CLOSED with a count
  -- window and none tripping, none due for its end or its TTL refresh: one BITFIELD per
  -- shadow, which checks the mirror as it writes (INCRBY of `seen`). A success of the
  -- kind of the outcome it evicts (the usual case) changes no count: the BITFIELD is that
  -- INCRBY and the slot's SET, nothing more is judged. Nil when the record is not that
  -- simple, false when the mirror was stale (nothing changed either way; the mirror is
  -- then dropped by the caller).
  local function feed_fast(m, now, fails, ms)
    local n_m = #m
    local vf = PRESENT + fails * FAILED + (ms < MS_MASK and ms or MS_MASK)
    for i = 1, n_m do
      local e = m[i]
      if now >= e[M_DEADLINE] or now < e[M_TTL_AT] then undo_before(m, i); return nil end
      local s = ms > e[M_SLOW_MS] and SLOW or 0
      local ver, ring = e[M_VER], e[M_RING]
      local head = ver % SPAN % e[M_SIZE]
      local o, v = ring[head], vf + s
      local bit = BIT[head] or bit_of(head)
      local r, calls, failures, slow
      if fails == 0 and o - o % SLOW == v - v % SLOW then
        r = rcall('BITFIELD', e[M_KRING], 'INCRBY', 'i64', F_SEEN, '1', 'SET', 'u32', bit,
                  VALUE[v] or value_text(v))
      else
        r, calls, failures, slow = write_counts(e, bit, o, v, s / SLOW, fails)
        if not r then undo_before(m, i); return nil end
      end
      if r[1] ~= ver + 1 then undo(e, bit, r); undo_before(m, i); return false end
      ring[head], e[M_VER] = v, ver + 1
      if calls then
        e[M_CALLS], e[M_FAILS], e[M_SLOW], e[M_SEEN_F] = calls, failures, slow,
                                                        e[M_SEEN_F] + fails
      end
      if n_m > 1 then e[M_BIT], e[M_R] = bit, r end
    end
    return true
  end

  -- The record, from the mirror when it can: true when it fed the shadows (`feeds`:
  -- the library's feeds so far).
  local function fed(kstate, feeds, now, ok, fails, ms)
    local m = MIRROR[kstate]
    if not m then return false end
    local done
    if ok + fails == 1 then done = feed_fast(m, now, fails, ms) end
    if done then return true end
    if done == false then
      if N_COOLING >= 256 then COOLING, N_COOLING = {}, 0 end
      COOLING[kstate], N_COOLING = feeds + COOL, N_COOLING + 1
    end
    MIRROR[kstate], N_MIRROR = nil, N_MIRROR - 1
    return false
  end

  -- After the general way fed one outcome to shadows `list` (feed_general's): mirrored,
  -- unless the breaker's mirror went stale lately.
  local function after(kstate, feeds, list)
    local cool = COOLING[kstate]
    if cool and feeds < cool then return end
    COOLING[kstate] = nil
    mirror(kstate, list, feeds)
  end

  -- A breaker's mirror dropped (its shadows set, cleared or ended here).
  local function forget(kstate)
    if MIRROR[kstate] then MIRROR[kstate], N_MIRROR = nil, N_MIRROR - 1 end
  end

  return {fed = fed, after = after, forget = forget}
end

local mirrors  -- make_mirror's functions (a library's: never made under EVAL)
local feeds = 0  -- this library's feeds (under EVAL: 0 at every call's)

-- Feeds every shadow of the breaker whose state record is `kstate` one record's
-- outcomes: from the mirror when it can (one BITFIELD per shadow), else the general
-- way (after which a library mirrors the breaker's shadows, when they are all CLOSED
-- with count windows and the record was one outcome).
local function feed(kstate, now, micros, ok, fails, slows, ms)
  feeds = feeds + 1
  if feeds > 1 then
    mirrors = mirrors or make_mirror(layout, record_codec)
    if mirrors.fed(kstate, feeds, now, ok, fails, ms) then return end
  end
  local list = feed_general(kstate, now, micros, ok, fails, slows, ms)
  if mirrors and list and ok + fails == 1 then mirrors.after(kstate, feeds, list) end
end

-- A breaker's mirror dropped (its shadows set, cleared or ended here).
local function forget(kstate)
  if mirrors then mirrors.forget(kstate) end
end

-- A hello's declared shadows: ARGV[2] '<fp>@<worker>#<shadow>=<wire>|...' split into
-- the hello and the declarations (nil: none).
local function split_hello(arg)
  local at = find(arg, '#', 1, true)
  if not at then return arg, nil end
  return sub(arg, 1, at - 1), sub(arg, at + 1)
end

local function valid_name(shadow)
  return shadow and #shadow >= 1 and #shadow <= 40 and match(shadow, '^[%w_.%-]+$') ~= nil
end

-- The c<slot> field's text (an actor's '|' would end it early: written as '/').
local function spec_text(until_ms, shadow, wire, set_at, source, actor, reason)
  return int(until_ms) .. '|' .. shadow .. '|' .. wire .. '|' .. int(set_at) .. '|' .. source
         .. '|' .. string.gsub(actor, '|', '/') .. '|' .. reason
end

-- The first free slot (1..MAX), or nil.
local function free_slot(slots)
  for slot = 1, MAX do
    if not (slots[slot] and slots[slot][1]) then return slot end
  end
  return nil
end

-- Creates or replaces shadow `shadow` in `slot` (the checks done) with config `wire`
-- (`c` parsed): its fields, an empty ring, the live record's bit, the TTLs, a history
-- entry. Every other shadow of the breaker moves to its next epoch (a mirror of them
-- went stale).
local function put(kstate, k, slots, slot, shadow, c, wire, until_ms, source, actor, reason,
                   now, kind)
  local st = unpack_state(nil, nil)
  st.ttl_at, st.since, st.started = now, now, now
  local kring = ring_key(kstate, slot)
  local old = rcall('EXISTS', kring) == 1 and decode(read_hdr(kring), HOT_N, 8)[8] or nil
  st.epoch = next_epoch(old)
  forget(kstate)
  rcall('HSET', k, 'c' .. slot, spec_text(until_ms, shadow, wire, now, source, actor, reason),
        's' .. slot, pack_cold(st))
  rcall('HDEL', k, 'h' .. slot)  -- (the header's place before the rings held it)
  new_ring(kring, c, pack_hot(st))
  local ttl = keep_ms(c, until_ms, now)
  for other = 1, MAX do  -- the hash lives as long as its longest-lived shadow may
    local t = slots[other]
    if other ~= slot and t and t[4] then
      ttl = max(ttl, keep_ms(t[4], t[4].until_ms, now))
      local kr = ring_key(kstate, other)
      if rcall('EXISTS', kr) == 1 then
        local seen = decode(read_hdr(kr), HOT_N, 8)[8]
        rcall('BITFIELD', kr, 'SET', 'i64', '448', int(next_epoch(seen) + seen % SPAN))  -- (seen)
      end
    end
  end
  rcall('PEXPIRE', k, int(ttl))
  flag(kstate, true)
  history(kstate, shadow, {{'CLOSED', 'CLOSED', reason, -1, -1, kind, 0, 0, 0, 0, actor}}, now)
  pcall_('PEXPIRE', kstate .. ':shadow:events', int(ttl))
end

-- Declared shadows (the registry's `shadow:`), renewed by every worker's hello: each
-- lives DECLARED_LEASE ms past the last; a changed config replaces the state; an
-- operator's shadow of the same name is left alone; beyond MAX, ignored.
local function declare(kstate, decl, now)
  local k = kstate .. ':shadow'
  if foreign_type(k, 'hash') then return end
  local slots, byname = read_all(k)
  if not slots then return end
  for shadow, wire in gmatch(decl, '([^=|]+)=([^|]*)') do
    local slot = byname[shadow]
    local t = slot and slots[slot]
    local c = valid_name(shadow) and breaker_config.parse(wire)
    if c then
      local until_ms = now + DECLARED_LEASE
      local old = t and t[4]
      if old and old.source == 'declared' and old.wire == wire then
        rcall('HSET', k, 'c' .. slot, int(until_ms) .. sub(t[1], #match(t[1], '^%d*') + 1))
      elseif (old and old.source == 'declared') or not old then
        slot = slot or free_slot(slots)
        if slot then
          slots[slot] = slots[slot] or {true}
          put(kstate, k, slots, slot, shadow, c, wire, until_ms, 'declared', '', 'declared',
              now, 'declared')
        end
      end
    end
  end
end

-- The `shadow` op (lua/breaker.lua's entry hands it over): ARGV[2] set | clear,
-- ARGV[3] shadow name ('*' with clear: every one), ARGV[4] the candidate's config wire
-- string (set), ARGV[5] for ms ('' or 0: no end), ARGV[6] actor, ARGV[7] reason.
-- Reply: the number of shadows the breaker then has. Every check before the first write.
local function op(keys, argv)
  local kstate = keys[1]
  forget(kstate)
  local k = kstate .. ':shadow'
  local action, shadow = argv[2], argv[3]
  local actor, reason = argv[6] or '', argv[7] or ''
  local err = foreign_type(kstate, 'string') or foreign_type(k, 'hash')
              or foreign_type(kstate .. ':shadow:events', 'stream')
  if err then return err end
  local t = rcall('TIME')
  local now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
  local slots, byname, count = read_all(k)
  if action == 'set' then
    if not valid_name(shadow) then
      return args_error('shadow name must be 1-40 letters, digits, _ . or -')
    end
    local c = breaker_config.parse(argv[4] or '')
    if not c then return args_error('bad config ' .. tostring(argv[4])) end
    local for_ms = tonumber(argv[5] ~= '' and argv[5] or '0')
    if not for_ms or for_ms < 0 or for_ms % 1 ~= 0 then
      return args_error('shadow for ms must be an integer >= 0')
    end
    local slot = byname[shadow]
    if not slot then
      slot = free_slot(slots)
      if not slot then return args_error('a breaker has at most ' .. MAX .. ' shadows') end
    end
    local dels = {}
    if byname[shadow] then ending(kstate, slot, slots[slot], 'replaced', reason, actor, now, dels) end
    if #dels > 0 then rcall('HDEL', k, unpack(dels)) end
    put(kstate, k, slots, slot, shadow, c, argv[4], for_ms > 0 and now + for_ms or 0, 'operator',
        actor, reason, now, 'set')
    return byname[shadow] and count or count + 1
  elseif action == 'clear' then
    local dels, left = {}, count
    for name, slot in pairs(byname) do
      if shadow == '*' or name == shadow then
        left = left - 1
        ending(kstate, slot, slots[slot], 'cleared', reason, actor, now, dels)
      end
    end
    finish_ends(kstate, k, dels, left)
    return left
  end
  return args_error('shadow action must be set or clear, got ' .. tostring(action))
end

return {feed = feed, op = op, declare = declare, split_hello = split_hello,
        SHADOWED = SHADOWED, MAX = MAX}
