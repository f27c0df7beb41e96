--!lib needs record_layout record_codec breaker_shadow breaker_rollout
-- The breaker's hot path (lua/breaker.lua): the usual record, one successful call,
-- not slow and not a probe, in CLOSED with a count window (or a TIME window in the
-- second it saw last), the caller's config stored
-- (fingerprint; or a worker's repeated hello with it, which costs one HSET after the
-- record: lua/lib/breaker_rollout.lua `rehello`), no override, no TTL refresh due.
-- It is what the general path does
-- for that case (the same commands: GETRANGE, BITFIELD SET, SETRANGE of the totals
-- group, the short reply), without the per-call context: its state is the locals of
-- `record` (registers, the cheapest values of Lua). nil when the case is not that
-- simple (the general path then runs and decides, having nothing of this one's to
-- undo). A success can still make the window's rates count (the calls reach
-- minimum_calls, or a quorum now met): that is left to the general path too, with the
-- slot written back. Also the server time, which both paths read.
--
-- Two forms of the call reach it: the full record (ARGV as lua/breaker.lua lists them,
-- answered {'CLOSED', now_ms, since_ms}) and the compact one (`compact`), ARGV
-- {fingerprint, ms}: one success, without the op, config wire, name and channel the
-- hot path never reads, answered now_ms; the entry answers 0 ("send the full form";
-- nothing written) whenever this path cannot finish it (docs/KEY_SCHEMA.md, "The
-- compact record").
-- Only the hot fields it uses are decoded (magic to failures_total: the half-open
-- figures before them are skipped).
local tonumber, min, byte, rep, sub = tonumber, math.min, string.byte, string.rep, string.sub
local rcall, pcall_ = redis.call, redis.pcall
local layout, packer, int = record_layout, record_codec.packer, record_codec.int
local rehello = breaker_rollout.rehello
local MAGIC, WIN, COUNT_SLOT = layout.MAGIC, layout.WINDOW_AT, layout.COUNT_SLOT_BYTES
local PRESENT, FAILED, SLOW, MS_MASK = layout.PRESENT, layout.FAILED, layout.SLOW, layout.MS_MASK
local HOT_AT, HOT_LAST, HOT_BYTES = layout.HOT_AT, layout.HOT_LAST, layout.HOT_BYTES
local TOTALS_AT = layout.TOTALS_AT
-- the hot fields from magic on (the half-open figures and their config before it are
-- the general path's), and where they start in the hot read
local USED_AT = layout.HOT_LOW_BYTE.magic - 7
local USED_FORMAT = '>' .. rep('i8', layout.HOT_FIELDS - (USED_AT - 1) / 8)
local TOTALS_FORMAT = '>' .. rep('i8', layout.TOTALS_FIELDS)
-- the low bytes of the window type and the state code in the hot read
local WINDOW_TYPE_BYTE, STATE_BYTE = layout.HOT_LOW_BYTE.window_type, layout.HOT_LOW_BYTE.state
-- decimal texts and numbers, kept (a library keeps them; at most 256 new ones, then afresh)
local FP_TEXT, SLOT_BIT, MS_NUM, MS_SLOT, FAST_N = {}, {}, {}, {}, 0

-- The server time in ms, and its microseconds (the open wait's random draw). The
-- seconds' text changes once a second: its number is kept (one strtod less per call).
local last_sec_text, last_sec_ms = nil, 0
local function server_time()
  local t = rcall('TIME')
  local us, s = tonumber(t[2]), t[1]
  if s ~= last_sec_text then last_sec_text, last_sec_ms = s, tonumber(s) * 1000 end
  return last_sec_ms + (us - us % 1000) / 1000, us
end

-- Returns the reply, or nil and (when it read them) the hot fields' bytes and the
-- server time, which the general path then uses instead of reading them again.
local function record(keys, args, given_now, given_micros, compact)
  local a2, ms_text = args[1], args[2]
  if not compact then
    a2 = args[2]
    if args[7] ~= '1' or args[8] ~= '0' or args[9] ~= '0' or args[6] ~= '' then
      return nil, nil, given_now, given_micros
    end
    ms_text = args[10]
  end
  if not packer then return nil, nil, given_now, given_micros end
  local k = keys[1]
  local raw = pcall_('GETRANGE', k, HOT_AT, HOT_LAST)
  if type(raw) ~= 'string' or #raw < HOT_BYTES then return nil, nil, given_now, given_micros end
  -- a TIME window of an earlier version's layout (type 1) or another state than CLOSED
  -- leaves at once, before the fields are decoded
  if byte(raw, WINDOW_TYPE_BYTE) == 1 or byte(raw, STATE_BYTE) ~= 0 then
    return nil, raw, given_now, given_micros
  end
  -- the duration and its slot value, kept by the duration's text (a few values recur:
  -- a table read instead of strtod and a '%d' format per call)
  local ms, slot_text = MS_NUM[ms_text], MS_SLOT[ms_text]
  if not slot_text then
    ms = tonumber(ms_text)
    if not ms or ms < 0 or ms % 1 ~= 0 then return nil, raw, given_now, given_micros end
    if FAST_N >= 256 then FP_TEXT, SLOT_BIT, MS_NUM, MS_SLOT, FAST_N = {}, {}, {}, {}, 0 end
    slot_text, FAST_N = int(PRESENT + min(ms, MS_MASK)), FAST_N + 1
    MS_NUM[ms_text], MS_SLOT[ms_text] = ms, slot_text
  end
  -- the hot group from magic on, as the general path's `load` reads it (this record's
  -- values)
  local magic, stored_fp, window_type, window_size, minimum_calls,
        failure_threshold, slow_threshold, key_ttl, code, since_ms, override_until,
        ttl_refreshed_at, n_calls, n_failures, n_slow, sum_ms, ring_head, window_sec,
        write_seq, calls_total, failures_total = packer.unpack(USED_FORMAT, raw, USED_AT)
  if magic ~= MAGIC or code ~= 0 or window_type == 1 or window_type > 2 or window_size <= 0
      or override_until ~= 0 then
    return nil, raw, given_now, given_micros
  end
  if window_type == 2 then
    -- a TIME window stays here only in the second it saw last (the first call of a new
    -- second moves it on, on the general path: lua/lib/breaker_window.lua advance_time);
    -- `ring_head` is its epoch (window type 1: a record an earlier version wrote)
    if not given_now then given_now, given_micros = server_time() end
    if window_sec ~= (given_now - given_now % 1000) / 1000 or ring_head == 0 then
      return nil, raw, given_now, given_micros
    end
  end
  if FAST_N >= 256 then FP_TEXT, SLOT_BIT, MS_NUM, MS_SLOT, FAST_N = {}, {}, {}, {}, 0 end
  local fp_text = FP_TEXT[stored_fp]
  if not fp_text then
    fp_text, FAST_N = int(stored_fp), FAST_N + 1
    FP_TEXT[stored_fp] = fp_text
  end
  local worker = nil
  if fp_text ~= a2 then
    -- a hello '<fp>@<worker>' of the config in force (longer than any fingerprint)
    local n = #fp_text
    if compact or #a2 <= 15 or byte(a2, n + 1) ~= 64 or sub(a2, 1, n) ~= fp_text
        or sub(a2, -4) == '@bye' then
      return nil, raw, given_now, given_micros
    end
    worker = sub(a2, n + 2)
    -- an operator's recording switch (`distbreaker record start`) reaches a worker in its
    -- hello's full reply (lua/lib/breaker_sample.lua): that hello takes the general path
    if pcall_('EXISTS', k .. ':rec:on') == 1 then return nil, raw, given_now, given_micros end
  end
  local t_now, us = given_now, given_micros
  if not t_now then t_now, us = server_time() end
  if t_now - ttl_refreshed_at >= key_ttl / 2 or ttl_refreshed_at > t_now then
    return nil, raw, t_now, us
  end
  local o, n, f, sl, total, next_head
  if window_type == 2 then
    -- a TIME window in the second it saw last: only the header's totals change
    n, f, sl, total, next_head = n_calls + 1, n_failures, n_slow, sum_ms + ms, ring_head
    if n >= minimum_calls
        and (f * 1000000 >= failure_threshold * n or sl * 1000000 >= slow_threshold * n) then
      return nil, raw, t_now, us
    end
  else
  local m = min(ms, MS_MASK)
  local bit = SLOT_BIT[ring_head]
  if not bit then
    bit, FAST_N = int((WIN + COUNT_SLOT * ring_head) * 8), FAST_N + 1
    SLOT_BIT[ring_head] = bit
  end
  local r = pcall_('BITFIELD', k, 'SET', 'u32', bit, slot_text)
  if r.err then return nil, raw, t_now, us end
  o, n, f, sl, total = r[1], n_calls + 1, n_failures, n_slow, sum_ms + m
  if o >= PRESENT then  -- the slot's old outcome leaves the window
    local old = o - PRESENT
    n = n - 1
    if old >= FAILED then f, old = f - 1, old - FAILED end
    if old >= SLOW then sl, old = sl - 1, old - SLOW end
    total = total - old
  end
  if n >= minimum_calls and n > 0
      and (f * 1000000 >= failure_threshold * n or sl * 1000000 >= slow_threshold * n) then
    rcall('BITFIELD', k, 'SET', 'u32', bit, int(o))
    return nil, raw, t_now, us
  end
  next_head = (ring_head + 1) % window_size
  end
  -- the totals group (window totals, head, window_sec, seq, the cumulative counters);
  -- the state's own fields stay
  -- (seq's bit 32: shadow configs exist, fed after the write: lua/lib/breaker_shadow.lua)
  local shadowed = write_seq >= 4294967296
  -- (a TIME window's first write: through pcall, a refusal leaves the general path to
  -- answer it)
  local w = (window_type == 2 and pcall_ or rcall)('SETRANGE', k, TOTALS_AT, packer.pack(
    TOTALS_FORMAT, n, f, sl, total, next_head, window_sec,
    shadowed and (write_seq + 1) % 4294967296 + 4294967296 or (write_seq + 1) % 4294967296,
    calls_total + 1, failures_total))
  if type(w) == 'table' and w.err then return nil, raw, t_now, us end
  if shadowed then pcall(breaker_shadow.feed, k, t_now, us, 1, 0, 0, ms) end
  if worker then rehello(k .. ':meta', k .. ':cfgs', worker, fp_text, args[3], t_now, key_ttl) end
  if compact then return t_now end
  return {'CLOSED', t_now, since_ms}
end

return {record = record, server_time = server_time}
