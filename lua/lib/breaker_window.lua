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
local rcall, pcall_, rep, sub, byte = redis.call, redis.pcall, string.rep, string.sub,
                                     string.byte
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

-- Zero runs of `n` bytes. string.rep builds a string byte by byte (about 20
-- instructions a byte); a cut of one long zero string kept for the library's life is
-- one copy. The last few lengths are kept too (a worker sees few window sizes and
-- idle gaps): a kept string costs no allocation, which Lua's collector would pay
-- for again in proportion. Longer runs than the longest TIME ring (a large COUNT
-- window's reset) are built.
local ZERO_KEPT, ZERO_LONG = 32, TIME_SLOT * 3600
local zero_long = nil
local zero_runs, n_zero_runs = {}, 0
local function zeros(n)
  local z = zero_runs[n]
  if z then return z end
  if n > ZERO_LONG then return rep('\0', n) end
  if not zero_long then zero_long = rep('\0', ZERO_LONG) end
  z = sub(zero_long, 1, n)
  if n_zero_runs >= ZERO_KEPT then zero_runs, n_zero_runs = {}, 0 end
  zero_runs[n], n_zero_runs = z, n_zero_runs + 1
  return z
end

-- Time window eviction: the fields calls, failures, slow, ms (2-5 of each slot)
-- summed over the `count` slots of the string s whose second (field 1) is the one
-- expected there: `expect` for the first, one more for each next; a slot holding
-- another second is stale (left by an earlier gap: eviction does not zero slots)
-- and counts nothing. Blocks of zero slots (never used, or cleared) are skipped by
-- one comparison with a kept string of zeros: Lua strings are interned, so the
-- block's `sub` finds that string (no allocation) and the comparison is of two
-- pointers. Other slots are decoded one by one, without tables. Answers the sums
-- and the second expected next.
local BLOCK = 64
local ZERO_BLOCK = rep('\0', TIME_SLOT * BLOCK)
local SLOT_FORMAT = '>I4I4I4I4I4'
local function sum_run(s, count, expect, c, f, sl, ms)
  if #s < count * TIME_SLOT then s = s .. rep('\0', count * TIME_SLOT - #s) end
  local pos = 1
  while count > 0 do
    local k = min(count, BLOCK)
    local bytes = k * TIME_SLOT
    -- (a block whose first slot holds a second is busy: no copy made to compare it)
    if k < BLOCK or byte(s, pos + 3) ~= 0 or byte(s, pos + 2) ~= 0
        or sub(s, pos, pos + bytes - 1) ~= ZERO_BLOCK then
      local t = expect
      for at = pos, pos + bytes - 1, TIME_SLOT do
        if packer then
          local second, n, nf, ns, nms = packer.unpack(SLOT_FORMAT, s, at)
          if second == t then c, f, sl, ms = c + n, f + nf, sl + ns, ms + nms end
        else
          local v = decode(s, 5, 4, at)
          if v[1] == t then c, f, sl, ms = c + v[2], f + v[3], sl + v[4], ms + v[5] end
        end
        t = t + 1
      end
    end
    pos, count, expect = pos + bytes, count - k, expect + k
  end
  return c, f, sl, ms, expect
end

-- The sums of `count` slots from slot `first` (wrapping), the first expected to
-- hold second `expect`: one GETRANGE, two when the run wraps.
local function sum_slots(key, first, count, expect, window_size)
  local tail = min(count, window_size - first)
  local at = WIN + TIME_SLOT * first
  local c, f, sl, ms
  c, f, sl, ms, expect = sum_run(rcall('GETRANGE', key, int(at),
                                       int(at + TIME_SLOT * tail - 1)),
                                 tail, expect, 0, 0, 0, 0)
  if count > tail then
    c, f, sl, ms = sum_run(rcall('GETRANGE', key, int(WIN),
                                 int(WIN + TIME_SLOT * (count - tail) - 1)),
                           count - tail, expect, c, f, sl, ms)
  end
  return c, f, sl, ms
end

-- Time window: the seconds in (window_sec, sec] leave it. Nothing is zeroed: a slot
-- counts only while it holds a second of the window (the totals are the sum of those
-- slots), so the slots of seconds that left are simply no longer counted, and
-- this second's slot starts afresh when it holds another second. The totals lose
-- what the run of evicted seconds held (their slots, from slot (window_sec + 1) %
-- size, hold seconds window_sec + 1 - size ...): read in one GETRANGE (two when it
-- wraps), or, when that run is the larger part of the ring, the totals are the sum
-- of the slots that stay. So any gap reads at most half the ring, writes nothing
-- but this second's slot, and idle seconds cost next to nothing (sum_run).
-- Answers whether the whole window restarts (the gap is >= the window, or the
-- clock went back), whether its ring must then be zeroed (the clock went back:
-- slots of seconds ahead of it would count again), the totals and the number of
-- seconds that left (0: none, or nothing was counted).
local function evict_time(key, sec, window_sec, window_size, calls, failures, slow, total_ms)
  if sec < window_sec then return true, true, 0, 0, 0, 0, 0 end
  if window_sec == 0 or sec - window_sec >= window_size then
    return calls ~= 0 or window_sec ~= 0, false, 0, 0, 0, 0, 0
  end
  if calls <= 0 then return false, false, calls, failures, slow, total_ms, 0 end
  local gap = sec - window_sec
  if gap * 2 <= window_size then
    local c, f, sl, ms = sum_slots(key, (window_sec + 1) % window_size, gap,
                                   window_sec + 1 - window_size, window_size)
    calls, failures, slow, total_ms = calls - c, failures - f, slow - sl, total_ms - ms
  else
    calls, failures, slow, total_ms = sum_slots(key, (sec + 1) % window_size,
                                                window_size - gap, sec + 1 - window_size,
                                                window_size)
  end
  return false, false, calls, failures, slow, total_ms, gap
end

-- Time window record: this second's slot with the outcomes added (read first unless
-- the ring was cleared by this call; a slot holding another second starts from zero);
-- answers its offset and its 5 values.
local function record_time(key, now, window_size, cleared, n, fails, slows, ms)
  local sec = floor(now / 1000)
  local off = WIN + TIME_SLOT * (sec % window_size)
  local cur
  if cleared then
    cur = {sec, 0, 0, 0, 0}
  else
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

-- The time window's writes: the ring zeroed whole (a kept zero string: one copy)
-- when it restarts with slots that would count again, then this second's slot.
local function write_time(key, whole, window_size, slot_at, slot_values)
  if whole then rcall('SETRANGE', key, WIN, zeros(TIME_SLOT * window_size)) end
  if slot_at then rcall('SETRANGE', key, int(slot_at), encode(slot_values, 1, 5, 4)) end
end

-- The window's writes (after the header): a time window's (write_time); a count
-- window cleared whole (a new record is created at full length by the caller, so
-- record_one's BITFIELD SET never grows the string: its undo could not shrink it
-- back), then its slots (from slot `from`, wrapping).
local function write(key, whole, window_type, window_size, time_slot_at, time_slot_values,
                     n_count_slots, from, values)
  if window_type ~= 0 then
    return write_time(key, whole, window_size, time_slot_at, time_slot_values)
  end
  if whole then rcall('SETRANGE', key, WIN, zeros(COUNT_SLOT * window_size)) end
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

-- A new record's window, all zero (the caller writes the record in one piece, at
-- its full length, so Redis sizes the string exactly).
local function empty(window_type, window_size)
  return zeros((window_type == 0 and COUNT_SLOT or TIME_SLOT) * window_size)
end

return {rate = rate, exceeded = exceeded, describe = describe, evict_time = evict_time,
        record_time = record_time, evicted = evicted, record_one = record_one,
        record_many = record_many, write = write,
        empty = empty}
