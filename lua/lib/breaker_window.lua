--!lib needs record_layout record_codec
-- The breaker's sliding window (docs/KEY_SCHEMA.md, "Window"), in the state record
-- after the header: its bytes, the totals' arithmetic and the rates. Explicit data
-- flow: each function takes the key and the values it works on and answers the new
-- ones (lua/breaker.lua keeps the call's state; no upvalue is shared with it).
--
-- Count window: a ring of window_size u32 slots at byte WIN + 4 * slot: bit 31 set
-- for a recorded outcome, bit 30 failed, bit 29 slow, bits 0-28 its ms (capped).
-- Time window: slot s (epoch second % size) is 5 u32 at byte WIN + 20 * slot:
-- second, calls, failures, slow, ms.
local floor, min, max = math.floor, math.min, math.max
local rcall, pcall_, rep = redis.call, redis.pcall, string.rep
local layout = record_layout
local WIN, COUNT_SLOT, TIME_SLOT = layout.WINDOW_AT, layout.COUNT_SLOT_BYTES,
                                   layout.TIME_SLOT_BYTES
local PRESENT, FAILED, SLOW, MS_MASK = layout.PRESENT, layout.FAILED, layout.SLOW, layout.MS_MASK
local packer, decode, encode, int = record_codec.packer, record_codec.decode,
                                    record_codec.encode, record_codec.int

-- part / whole as a percentage with two decimals; -1 for no calls.
local function rate(part, whole)
  if whole <= 0 then return -1 end
  return floor(part * 10000 / whole) / 100
end

-- fails / n >= failure_threshold (rates in 1/10000 of a percent): integer arithmetic
local function exceeded(n, fails, slows, failure_threshold, slow_threshold)
  return fails * 1000000 >= failure_threshold * n or slows * 1000000 >= slow_threshold * n
end

local function describe(n, fails, slows, failure_threshold, slow_threshold)
  if fails * 1000000 >= failure_threshold * n then
    return 'failure rate ' .. rate(fails, n) .. '% >= ' .. (failure_threshold / 10000) .. '%'
  end
  return 'slow call rate ' .. rate(slows, n) .. '% >= ' .. (slow_threshold / 10000) .. '%'
end

-- `count` integers of `width` bytes at byte offset `off` of the record.
local function read_bytes(key, off, count, width)
  return decode(rcall('GETRANGE', key, int(off), int(off + count * width - 1)), count, width)
end

-- Time window: the seconds between the window's (window_sec) and this one (sec)
-- leave it. Answers true when the whole window is to be cleared (too old, or the
-- clock went back); else false and the totals less the evicted slots, whose offsets
-- are appended to `evicted_at` (zeroed when the record is written) up to n_evict.
local function evict_time(key, sec, window_sec, window_size, calls, failures, slow, total_ms,
                          evicted_at, n_evict)
  if window_sec == 0 or sec - window_sec >= window_size or sec < window_sec then
    return calls ~= 0 or window_sec ~= 0, calls, failures, slow, total_ms, n_evict
  end
  if calls > 0 then
    for s = window_sec + 1, sec do
      local off = WIN + TIME_SLOT * (s % window_size)
      local old = read_bytes(key, off, 5, 4)
      calls, failures, slow, total_ms = calls - old[2], failures - old[3], slow - old[4],
                                        total_ms - old[5]
      n_evict = n_evict + 1
      evicted_at[n_evict] = off
    end
  end
  return false, calls, failures, slow, total_ms, n_evict
end

-- Time window record: this second's slot with the outcomes added (read first unless
-- cleared or evicted by this call, in which case it starts from zero); answers its
-- offset and its 5 values.
local function record_time(key, now, window_size, cleared, evicted_at, n_evict, n, fails,
                           slows, ms)
  local sec = floor(now / 1000)
  local off = WIN + TIME_SLOT * (sec % window_size)
  local cur = nil
  for i = 1, n_evict do if evicted_at[i] == off then cur = {sec, 0, 0, 0, 0} end end
  if cleared then cur = {sec, 0, 0, 0, 0} end
  if not cur then
    cur = read_bytes(key, off, 5, 4)
    if cur[1] ~= sec then cur = {sec, 0, 0, 0, 0} end
  end
  cur[2], cur[3], cur[4], cur[5] = cur[2] + n, cur[3] + fails, cur[4] + slows, cur[5] + ms
  return off, cur
end

-- What a count slot's old value takes out of the totals (calls, failures, slow, ms);
-- bit 31 clear: the slot was empty, nothing.
local function evicted(o)
  if o < PRESENT then return 0, 0, 0, 0 end
  o = o - PRESENT
  local f, s = 0, 0
  if o >= FAILED then f, o = 1, o - FAILED end
  if o >= SLOW then s, o = 1, o - SLOW end
  return 1, f, s, o
end

-- The usual record, one outcome, in the slot at `head`: BITFIELD SET writes it and
-- answers the old value in one command, no tables. It is the call's first write, so
-- it goes through pcall (a refusal, OOM or ACL, leaves nothing written). Answers the
-- refusal, or nil, the slot's bit offset, its old value and the ms recorded.
local function record_one(key, head, fails, slows, ms)
  local m = min(ms, MS_MASK)
  local bit = int((WIN + COUNT_SLOT * head) * 8)
  local r = pcall_('BITFIELD', key, 'SET', 'u32', bit, int(PRESENT + fails * FAILED
                                                           + slows * SLOW + m))
  if r.err then return r.err end
  return nil, bit, r[1], m
end

-- Several outcomes from the slot at `head`: only the last window_size can stay. The
-- old values of the slots they overwrite are read here (one GETRANGE, two when the
-- ring wraps); the new ones go into `values` (written with the header, at the end).
-- Answers their count, the new head and what the totals change by.
local function record_many(key, head, window_size, ok, fails, slows, ms, values)
  local n = ok + fails
  local per_ms = floor(ms / n)
  local first = max(1, n - window_size + 1)
  local count = n - first + 1
  local tail = min(count, window_size - head)
  local old = read_bytes(key, WIN + COUNT_SLOT * head, tail, 4)
  if count > tail then
    local more = read_bytes(key, WIN, count - tail, 4)
    for i = 1, count - tail do old[tail + i] = more[i] end
  end
  -- (the failures and slow calls spread evenly over the outcomes; the evicted
  -- slots' outcomes as in `evicted`, inline: this loop runs once per outcome)
  local k, dn, df, ds, dms = 0, 0, 0, 0, 0
  local f, s = 0, 0
  for i = first, n do
    if fails > 0 then f = floor(i * fails / n) - floor((i - 1) * fails / n) end
    if slows > 0 then s = floor(i * slows / n) - floor((i - 1) * slows / n) end
    local m = per_ms
    if i == 1 then m = m + ms - per_ms * n end
    if m > MS_MASK then m = MS_MASK end
    k = k + 1
    values[k] = PRESENT + f * FAILED + s * SLOW + m
    dn, df, ds, dms = dn + 1, df + f, ds + s, dms + m
    local o = old[k]
    if o >= PRESENT then  -- the slot's old outcome leaves the window
      o = o - PRESENT
      dn = dn - 1
      if o >= FAILED then df, o = df - 1, o - FAILED end
      if o >= SLOW then ds, o = ds - 1, o - SLOW end
      dms = dms - o
    end
    head = (head + 1) % window_size
  end
  return k, head, dn, df, ds, dms
end

-- The window's writes (after the header): cleared whole (a new record is written at
-- full length, so record_one's BITFIELD SET never grows the string: its undo could
-- not shrink it back), the evicted time slots zeroed, this second's slot, the count
-- slots (from slot `from`, wrapping).
local function write(key, whole, window_type, window_size, evicted_at, n_evict, time_slot_at,
                     time_slot_values, n_count_slots, from, values)
  if whole then
    rcall('SETRANGE', key, WIN, rep('\0', (window_type == 0 and COUNT_SLOT or TIME_SLOT)
                                          * window_size))
  end
  for i = 1, n_evict do rcall('SETRANGE', key, evicted_at[i], rep('\0', TIME_SLOT)) end
  if time_slot_at then
    rcall('SETRANGE', key, time_slot_at, encode(time_slot_values, 1, 5, 4))
  end
  if n_count_slots > 0 then
    local tail = min(n_count_slots, window_size - from)
    local bytes = (tail == 1 and packer) and packer.pack('>I4', values[1])
                  or encode(values, 1, tail, 4)
    rcall('SETRANGE', key, int(WIN + COUNT_SLOT * from), bytes)
    if n_count_slots > tail then
      rcall('SETRANGE', key, WIN, encode(values, tail + 1, n_count_slots, 4))
    end
  end
end

return {rate = rate, exceeded = exceeded, describe = describe, evict_time = evict_time,
        record_time = record_time, evicted = evicted, record_one = record_one,
        record_many = record_many, write = write}
