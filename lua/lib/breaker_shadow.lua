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
-- call `feed` only when they read that bit (they read `seq` anyway). All shadows of a
-- breaker are one hash, <state key>:shadow, read with one HGETALL and written with
-- one HSET per record, whatever their number:
--   c:<shadow>  "<until ms>|<config wire string>" (until 0: no end)
--   i:<shadow>  "<set at ms>|<source>|<actor>|<reason>" (source: operator, declared)
--   s:<shadow>  the shadow's state: FIELDS big-endian i8 (below), then its window's
--               ring in the live record's slot format (count: u32 slots; time: 5 u32)
-- Its history: the stream <state key>:shadow:events (MAXLEN ~ 1000), every entry
-- naming its shadow. Both keys share the name's hash tag; their TTL is the
-- candidates' longest key TTL, refreshed by the feed (at most every TTL / 2).
local floor, min, max, tonumber, tostring = math.floor, math.min, math.max, tonumber, tostring
local sub, match, find, rep, gmatch = string.sub, string.match, string.find, string.rep,
                                      string.gmatch
local rcall, pcall_, unpack = redis.call, redis.pcall, unpack
local layout, packer = record_layout, record_codec.packer
local decode, decode_fields, encode, int = record_codec.decode, record_codec.decode_fields,
                                           record_codec.encode, record_codec.int
local PRESENT, FAILED, SLOW, MS_MASK = layout.PRESENT, layout.FAILED, layout.SLOW, layout.MS_MASK
local NEXT, AFTER_HALF_OPEN = breaker_transitions.NEXT, breaker_transitions.AFTER_HALF_OPEN
local REASON = breaker_transitions.REASON
local exceeded, rate, describe = breaker_window.exceeded, breaker_window.rate,
                                 breaker_window.describe
local evicted, sum_run = breaker_window.evicted, breaker_window.sum_run
local wait_in_open = breaker_ops.wait_in_open
local args_error, foreign_type = prelude.args_error, prelude.foreign_type

local MAX = 3                       -- shadows per breaker
local SHADOWED = 4294967296         -- bit 32 of the live record's `seq`
local DECLARED_LEASE = 60000        -- a declared shadow lives this long past a hello
local SEQ_AT = tonumber(layout.HOT_AT) + layout.HOT_LOW_BYTE.seq - 8  -- its first byte
local STATES = {'CLOSED', 'OPEN', 'HALF_OPEN'}
local CODE = {CLOSED = 0, OPEN = 1, HALF_OPEN = 2}
-- The state's fields (i8 each), in order:
--   code since open_until opens calls failures slow total_ms head wsec hp_done hp_fail
--   hp_slow started seen seen_failures trips rejected avoided open_ms ep_at
--   ep_rejected ep_avoided ttl_at ep_ms
-- (ep_*: the last episode, from a trip out of CLOSED back to CLOSED: its start, the
-- calls it would have rejected, the failures among them, its length once over, 0
-- while it runs)
local FIELDS = 25
local HEADER = 8 * FIELDS
local HEADER_FORMAT = '>' .. rep('i8', FIELDS)
local COUNT_SLOT, TIME_SLOT = layout.COUNT_SLOT_BYTES, layout.TIME_SLOT_BYTES
local TIME_FORMAT = '>I4I4I4I4I4'

local function pack_header(...)
  if packer then return packer.pack(HEADER_FORMAT, ...) end
  return encode({...}, 1, FIELDS, 8)
end

local function ring_bytes(c) return (c.window_type == 0 and COUNT_SLOT or TIME_SLOT) * c.window_size end

-- A fresh state: CLOSED since `now`, an empty window.
local function fresh(c, now)
  return pack_header(0, now, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, now, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                     now, 0) .. rep('\0', ring_bytes(c))
end

-- "<until>|<wire>" parsed (the config's table with `until`), kept per text (a library
-- keeps them; a few distinct texts per worker).
local SPECS, N_SPECS = {}, 0
local function spec_of(text)
  local c = SPECS[text]
  if c ~= nil then return c end
  local until_ms, wire = match(text, '^(%d+)|(.*)$')
  c = until_ms and breaker_config.parse(wire) or false
  if c then c.until_ms, c.wire = tonumber(until_ms), wire end
  if N_SPECS >= 64 then SPECS, N_SPECS = {}, 0 end
  SPECS[text], N_SPECS = c, N_SPECS + 1
  return c
end

-- Count window: `n` outcomes (`fails` failed, `slows` slow, `ms` in all) into the ring
-- from `head`, spread as lua/lib/breaker_window.lua's record_many spreads them. Answers
-- the new ring, head and the totals' changes.
local function count_record(ring, c, head, n, fails, slows, ms)
  local size = c.window_size
  if n == 1 then
    local at = COUNT_SLOT * head + 1
    local o = decode(sub(ring, at, at + 3), 1, 4)[1]
    local m = min(ms, MS_MASK)
    local v = PRESENT + fails * FAILED + slows * SLOW + m
    local dn, df, ds, dms = evicted(o)
    return sub(ring, 1, at - 1) .. encode({v}, 1, 1, 4) .. sub(ring, at + 4),
           (head + 1) % size, 1 - dn, fails - df, slows - ds, m - dms
  end
  local slots = decode(ring, size, 4)
  local per_ms = floor(ms / n)
  local dn, df, ds, dms = 0, 0, 0, 0
  for i = max(1, n - size + 1), n do
    local f = floor(i * fails / n) - floor((i - 1) * fails / n)
    local s = floor(i * slows / n) - floor((i - 1) * slows / n)
    local m = per_ms
    if i == 1 then m = m + ms - per_ms * n end
    m = min(m, MS_MASK)
    local on, of, os, oms = evicted(slots[head + 1])
    slots[head + 1] = PRESENT + f * FAILED + s * SLOW + m
    dn, df, ds, dms = dn + 1 - on, df + f - of, ds + s - os, dms + m - oms
    head = (head + 1) % size
  end
  return encode(slots, 1, size, 4), head, dn, df, ds, dms
end

-- Time window: the sums of `count` slots of the ring from slot `first` (wrapping), the
-- first expected to hold second `expect` (breaker_window's sum_run on the ring's bytes).
local function time_sums(ring, size, first, count, expect)
  local tail = min(count, size - first)
  local c, f, sl, ms
  c, f, sl, ms, expect = sum_run(sub(ring, TIME_SLOT * first + 1, TIME_SLOT * (first + tail)),
                                 tail, expect, 0, 0, 0, 0)
  if count > tail then
    c, f, sl, ms = sum_run(sub(ring, 1, TIME_SLOT * (count - tail)), count - tail, expect,
                           c, f, sl, ms)
  end
  return c, f, sl, ms
end

-- Time window: the seconds since `wsec` leave it (as breaker_window's evict_time does
-- on the live record). Answers the ring (zeroed when the clock went back), the totals.
local function time_evict(ring, size, sec, wsec, calls, fails, slows, total)
  if sec < wsec then return rep('\0', TIME_SLOT * size), 0, 0, 0, 0 end
  if wsec == 0 or sec - wsec >= size then return ring, 0, 0, 0, 0 end
  if calls <= 0 or sec == wsec then return ring, calls, fails, slows, total end
  local gap = sec - wsec
  if gap * 2 <= size then
    local c, f, sl, ms = time_sums(ring, size, (wsec + 1) % size, gap, wsec + 1 - size)
    return ring, calls - c, fails - f, slows - sl, total - ms
  end
  local c, f, sl, ms = time_sums(ring, size, (sec + 1) % size, size - gap, sec + 1 - size)
  return ring, c, f, sl, ms
end

-- Time window: this second's slot with the outcomes added.
local function time_record(ring, size, sec, n, fails, slows, ms)
  local at = TIME_SLOT * (sec % size) + 1
  local v = decode(sub(ring, at, at + TIME_SLOT - 1), 5, 4)
  if v[1] ~= sec then v = {sec, 0, 0, 0, 0} end
  v[2], v[3], v[4], v[5] = v[2] + n, v[3] + fails, v[4] + slows, v[5] + ms
  return sub(ring, 1, at - 1) .. encode(v, 1, 5, 4) .. sub(ring, at + TIME_SLOT)
end

-- One shadow fed one record: answers its new state bytes and its events (each
-- {from, to, reason, failure rate, slow rate, kind, episode ms, episode rejected,
-- episode avoided}), or nil when it has none.
local function step(c, blob, now, micros, ok, fails, slows, ms)
  local code, since, open_until, opens, calls, failures, slow, total_ms, head, wsec, hp_done,
        hp_fail, hp_slow, started, seen, seen_failures, trips, rejected, avoided, open_ms,
        ep_at, ep_rejected, ep_avoided, ttl_at, ep_ms = decode_fields(blob, FIELDS)
  local ring = sub(blob, HEADER + 1)
  if #ring ~= ring_bytes(c) then ring = rep('\0', ring_bytes(c)) end
  local n = ok + fails
  if n == 1 then slows = (ms > c.slow_ms) and 1 or 0 end  -- this candidate's slowness
  local events
  local function move(event, reason)
    local from = STATES[code + 1]
    local to = NEXT[from][event]
    if to == AFTER_HALF_OPEN then to = c.after_half_open end
    if type(to) ~= 'string' then return end
    local fr, sr
    if from == 'HALF_OPEN' then
      fr, sr = rate(hp_fail, hp_done), rate(hp_slow, hp_done)
    else
      fr, sr = rate(failures, calls), rate(slow, calls)
    end
    code, since = CODE[to], now
    if to == 'OPEN' then
      if from == 'CLOSED' then
        trips, ep_at, ep_rejected, ep_avoided, ep_ms = trips + 1, now, 0, 0, 0
      end
      opens = opens + 1
      open_until = now + wait_in_open({open_wait = c.open_wait, wait_mult = c.wait_mult,
                                       wait_rnd = c.wait_rnd, max_open_wait = c.max_open_wait,
                                       opens = opens}, c.ttl_ms, micros)
      hp_done, hp_fail, hp_slow = 0, 0, 0
    elseif to == 'HALF_OPEN' then
      open_until, hp_done, hp_fail, hp_slow = 0, 0, 0, 0
    else  -- CLOSED: the episode ends
      ep_ms = now - ep_at
      open_ms, open_until, opens = open_ms + ep_ms, 0, 0
      calls, failures, slow, total_ms, head, wsec = 0, 0, 0, 0, 0, 0
      ring = rep('\0', ring_bytes(c))
    end
    events = events or {}
    events[#events + 1] = {from, to, reason or REASON[event], fr, sr, '', ep_ms, ep_rejected,
                           ep_avoided, ep_at}
  end
  -- time-driven transitions
  if code == 1 and now >= open_until then move('wait_elapsed') end
  if code == 2 and c.max_half_open > 0 and now >= since + c.max_half_open then
    move('max_wait_elapsed')
  end
  if c.window_type == 1 then
    local sec = floor(now / 1000)
    if sec ~= wsec then
      ring, calls, failures, slow, total_ms = time_evict(ring, c.window_size, sec, wsec, calls,
                                                         failures, slow, total_ms)
      wsec = sec
    end
  end
  seen, seen_failures = seen + n, seen_failures + fails
  if code == 0 then
    if c.window_type == 0 then
      local dn, df, ds, dms
      ring, head, dn, df, ds, dms = count_record(ring, c, head, n, fails, slows, ms)
      calls, failures, slow, total_ms = calls + dn, failures + df, slow + ds, total_ms + dms
    else
      ring = time_record(ring, c.window_size, wsec, n, fails, slows, ms)
      calls, failures, slow, total_ms = calls + n, failures + fails, slow + slows, total_ms + ms
    end
    if calls >= c.min_calls and calls > 0
        and exceeded(calls, failures, slow, c.failure_threshold, c.slow_threshold) then
      move('rates_exceeded', describe(calls, failures, slow, c.failure_threshold,
                                      c.slow_threshold))
    end
  elseif code == 1 then  -- OPEN: every call would have been rejected
    rejected, avoided = rejected + n, avoided + fails
    ep_rejected, ep_avoided = ep_rejected + n, ep_avoided + fails
  else  -- HALF_OPEN: the first permitted_calls_in_half_open probe, the rest are rejected
    local take = min(n, c.probes_max - hp_done)
    local pf, ps = floor(fails * take / n), floor(slows * take / n)
    hp_done, hp_fail, hp_slow = hp_done + take, hp_fail + pf, hp_slow + ps
    rejected, avoided = rejected + n - take, avoided + fails - pf
    ep_rejected, ep_avoided = ep_rejected + n - take, ep_avoided + fails - pf
    if hp_done >= c.probes_max then
      if exceeded(hp_done, hp_fail, hp_slow, c.failure_threshold, c.slow_threshold) then
        move('probes_failed', 'half-open probes: ' .. describe(hp_done, hp_fail, hp_slow,
                                                               c.failure_threshold,
                                                               c.slow_threshold))
      else
        move('probes_succeeded')
      end
    end
  end
  local refresh = now - ttl_at >= c.ttl_ms / 2 or ttl_at > now
  if refresh then ttl_at = now end
  return pack_header(code, since, open_until, opens, calls, failures, slow, total_ms, head, wsec,
                     hp_done, hp_fail, hp_slow, started, seen, seen_failures, trips, rejected,
                     avoided, open_ms, ep_at, ep_rejected, ep_avoided, ttl_at, ep_ms) .. ring,
         events, refresh
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

-- The shadow hash as {name = {spec text, info text, state bytes}} and the count.
local function read_all(k)
  local all = pcall_('HGETALL', k)
  if type(all) ~= 'table' or all.err then return nil, 0 end
  local found, count = {}, 0
  for i = 1, #all, 2 do
    local field = all[i]
    local kind, shadow = sub(field, 1, 1), sub(field, 3)
    local t = found[shadow]
    if not t then t = {}; found[shadow] = t end
    if kind == 'c' then count = count + 1; t[1] = all[i + 1]
    elseif kind == 'i' then t[2] = all[i + 1]
    else t[3] = all[i + 1] end
  end
  return found, count
end

-- A shadow's end (expired, cleared, replaced): its fields go, with a history entry
-- carrying its figures (and the open episode's, if one was running).
local function ending(kstate, shadow, t, kind, reason, actor, now, dels)
  dels[#dels + 1] = 'c:' .. shadow
  dels[#dels + 1] = 'i:' .. shadow
  dels[#dels + 1] = 's:' .. shadow
  local st = t[3] and decode(sub(t[3], 1, HEADER), FIELDS, 8) or {0}
  local name = STATES[(st[1] or 0) + 1] or 'CLOSED'
  local ep = (st[1] or 0) ~= 0 and st[21] or 0
  history(kstate, shadow, {{name, name, reason, -1, -1, kind, ep > 0 and now - ep or 0,
                            st[22] or 0, st[23] or 0, ep, actor,
                            {'seen', st[15] or 0, 'trips', st[17] or 0, 'rejected_total',
                             st[18] or 0, 'avoided_total', st[19] or 0}}}, now)
end

local function finish_ends(kstate, k, dels, left)
  if #dels > 0 then rcall('HDEL', k, unpack(dels)) end
  if left == 0 then
    rcall('DEL', k)
    flag(kstate, false)
  end
end

-- Feeds every shadow of the breaker whose state record is `kstate` one record's
-- outcomes (`ok` successes, `fails` failures, `slows` slow, `ms` in all), after the
-- live record was written. Shadows whose end passed are removed here.
local function feed(kstate, now, micros, ok, fails, slows, ms)
  local k = kstate .. ':shadow'
  local found, count = read_all(k)
  if not found then return end
  if count == 0 then
    if next(found) then rcall('DEL', k) end
    return flag(kstate, false)
  end
  local writes, dels, left, keep = {}, {}, count, 0
  for shadow, t in pairs(found) do
    local c = t[1] and spec_of(t[1])
    if not c then
      if t[1] then
        left = left - 1
        ending(kstate, shadow, t, 'invalid', 'bad config', '', now, dels)
      else dels[#dels + 1] = 'i:' .. shadow; dels[#dels + 1] = 's:' .. shadow end
    elseif c.until_ms > 0 and now >= c.until_ms then
      left = left - 1
      ending(kstate, shadow, t, 'expired', 'its time ended', '', now, dels)
    else
      local bytes, events, refresh = step(c, t[3] or fresh(c, now), now, micros, ok, fails,
                                          slows, ms)
      writes[#writes + 1] = 's:' .. shadow
      writes[#writes + 1] = bytes
      if events then history(kstate, shadow, events, now) end
      if refresh then keep = max(keep, c.ttl_ms) end
    end
  end
  if #writes > 0 then rcall('HSET', k, unpack(writes)) end
  finish_ends(kstate, k, dels, left)
  if keep > 0 and left > 0 then
    rcall('PEXPIRE', k, int(keep))
    pcall_('PEXPIRE', kstate .. ':shadow:events', int(keep))
  end
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

-- Creates or replaces shadow `shadow` (the checks done): its fields, the live
-- record's bit, the TTLs, a history entry.
local function put(kstate, k, shadow, c, until_ms, text_info, now, kind, reason, actor)
  rcall('HSET', k, 'c:' .. shadow, int(until_ms) .. '|' .. c.wire, 'i:' .. shadow, text_info,
        's:' .. shadow, fresh(c, now))
  local ttl = max(c.ttl_ms, until_ms > 0 and until_ms - now or 0)
  local keep = rcall('PTTL', k)
  if keep < ttl then rcall('PEXPIRE', k, int(ttl)) end
  flag(kstate, true)
  history(kstate, shadow, {{'CLOSED', 'CLOSED', reason, -1, -1, kind, 0, 0, 0, 0, actor}}, now)
  pcall_('PEXPIRE', kstate .. ':shadow:events', int(max(ttl, rcall('PTTL', k))))
end

-- Declared shadows (the registry's `shadow:`), renewed by every worker's hello: each
-- lives DECLARED_LEASE ms past the last; a changed config replaces the state; an
-- operator's shadow of the same name is left alone; beyond MAX, ignored.
local function declare(kstate, decl, now)
  local k = kstate .. ':shadow'
  if foreign_type(k, 'hash') then return end
  local found, count = read_all(k)
  if not found then return end
  for shadow, wire in gmatch(decl, '([^=|]+)=([^|]*)') do
    local t = found[shadow]
    local c = valid_name(shadow) and spec_of('0|' .. wire)
    if c then
      local until_ms = now + DECLARED_LEASE
      local source = t and t[2] and match(t[2], '^%d+|([^|]*)|')
      local same = t and t[1] and match(t[1], '^%d+|(.*)$') == wire
      if t and t[1] and source == 'declared' and same then
        rcall('HSET', k, 'c:' .. shadow, int(until_ms) .. '|' .. wire)
      elseif (t and t[1] and source == 'declared') or (not (t and t[1]) and count < MAX) then
        if not (t and t[1]) then count = count + 1 end
        put(kstate, k, shadow, c, until_ms, int(now) .. '|declared||declared', now, 'declared',
            'declared', '')
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
  local k = kstate .. ':shadow'
  local action, shadow = argv[2], argv[3]
  local actor, reason = argv[6] or '', argv[7] or ''
  local err = foreign_type(kstate, 'string') or foreign_type(k, 'hash')
              or foreign_type(kstate .. ':shadow:events', 'stream')
  if err then return err end
  local t = rcall('TIME')
  local now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
  local found, count = read_all(k)
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
    local existing = found[shadow] and found[shadow][1]
    if not existing and count >= MAX then
      return args_error('a breaker has at most ' .. MAX .. ' shadows')
    end
    c = spec_of('0|' .. argv[4])
    local dels = {}
    if existing then ending(kstate, shadow, found[shadow], 'replaced', reason, actor, now, dels) end
    if #dels > 0 then rcall('HDEL', k, unpack(dels)) end
    put(kstate, k, shadow, c, for_ms > 0 and now + for_ms or 0,
        int(now) .. '|operator|' .. actor .. '|' .. reason, now, 'set', reason, actor)
    return existing and count or count + 1
  elseif action == 'clear' then
    local dels, left = {}, count
    for name, entry in pairs(found) do
      if (shadow == '*' or name == shadow) and entry[1] then
        left = left - 1
        ending(kstate, name, entry, 'cleared', reason, actor, now, dels)
      end
    end
    finish_ends(kstate, k, dels, left)
    return left
  end
  return args_error('shadow action must be set or clear, got ' .. tostring(action))
end

return {feed = feed, op = op, declare = declare, split_hello = split_hello,
        SHADOWED = SHADOWED, MAX = MAX}
