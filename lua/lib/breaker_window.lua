--!lib needs record_layout record_codec
-- The breaker's sliding window (docs/KEY_SCHEMA.md, "Window"), in the state record
-- after the header: its bytes, the totals' arithmetic and the rates. Explicit data
-- flow: each function takes the key and the values it works on and answers the new
-- ones (lua/breaker.lua keeps the call's state; no upvalue is shared with it).
--
-- Count window: a ring of window_size u32 slots at byte WIN + 4 * slot: bit 31 set
-- for a recorded outcome, bit 30 failed, bit 29 slow, bits 0-28 its ms (capped).
-- Time window: slot s (epoch second % size) is 5 u32 at byte WIN + 20 * slot: the
-- running totals at the end of that second (advance_time below).
local floor, min, max, tonumber = math.floor, math.min, math.max, tonumber
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
local ZERO_KEPT, ZERO_LONG = 32, (TIME_SLOT + 1) * 3600
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

-- Time window, cumulative slots (docs/KEY_SCHEMA.md, "Window"). Slot x % S holds the
-- running totals C(x) at the end of second x (calls, failures, slow modulo 2^32; ms
-- modulo 2^52, its high 20 bits in the slot's first u32, its low 32 bits in the
-- last), counted from the record's epoch `head` (C is 0 before it): only differences
-- mean anything. A second with calls is *active*; after the slots, two bitmaps (one
-- per parity of the lap floor(x / S), bit S - 1 - x % S for second x: the latest
-- second first) flag the active seconds of the last two laps. The header's totals T
-- are C(wsec) - C(wsec - S); C(y) for any y is C of the latest active second <= y
-- (nothing happened since), found by one BITPOS in C, so no gap is ever filled.
-- A call in the same second writes nothing but the header. The first call of a new
-- second `sec`: C(wsec) = T + C(wsec - S), the latter carried in slot wsec % S (it
-- was written there when second wsec started); C(sec - S) from the latest active
-- second in (wsec - S, sec - S] (one GETBIT when the gap is one second, else one
-- BITPOS, two across a lap's start, and its slot); the new totals are their
-- difference. It writes slot wsec (its C), slot sec (C(sec - S), carried), wsec's
-- flag, and zeroes the bitmap of a lap that starts. A handful of commands, a few
-- dozen bytes, at any gap. A slot whose first u32 is 2^20 or more holds an epoch
-- second: an old-layout slot (a worker of an earlier version wrote it): the record
-- is then re-based (below).
local M32, M52, HI_TOP = 4294967296, 4503599627370496, 1048576
local SLOT_FORMAT = '>I4I4I4I4I4'

-- The bytes of one slot holding the running totals c, f, s, ms.
local function time_slot(c, f, s, ms)
  local hi = floor(ms / M32)
  if packer then return packer.pack(SLOT_FORMAT, hi, c, f, s, ms - hi * M32) end
  return encode({hi, c, f, s, ms - hi * M32}, 1, 5, 4)
end

-- The running totals in the slot at byte `pos` of s, and whether it is foreign (an
-- old-layout slot).
local function slot_values(s, pos)
  local hi, c, f, sl, lo
  if packer and #s >= pos + TIME_SLOT - 1 then
    hi, c, f, sl, lo = packer.unpack(SLOT_FORMAT, s, pos)
  else
    local v = decode(s, 5, 4, pos)
    hi, c, f, sl, lo = v[1], v[2], v[3], v[4], v[5]
  end
  return c, f, sl, hi * M32 + lo, hi >= HI_TOP
end

local function read_slot(key, size, x)
  local at = WIN + TIME_SLOT * (x % size)
  return slot_values(rcall('GETRANGE', key, int(at), int(at + TIME_SLOT - 1)), 1)
end

-- A bitmap's bytes; the first byte of the bitmaps; the bit offset of second x's flag.
local function flag_bytes(size) return floor((size + 7) / 8) end
local function flags_at(size) return WIN + TIME_SLOT * size end
local function flag_bit(size, x)
  local lap = floor(x / size)
  return (flags_at(size) + (lap % 2) * flag_bytes(size)) * 8 + size - 1 - (x - lap * size)
end

-- The first set bit in bits [top, bottom] of the record, or -1: BITPOS in BIT units
-- (Redis 7); before 7 (and where the version is not said: fakeredis), the first
-- byte's bits from `top` are tested here and BITPOS searches the whole bytes after it.
local BIT_UNITS = (tonumber(redis.REDIS_VERSION_NUM) or 0) >= 458752  -- 0x070000
local function first_set(key, top, bottom)
  if BIT_UNITS then return rcall('BITPOS', key, 1, int(top), int(bottom), 'BIT') end
  local tb, bb = floor(top / 8), floor(bottom / 8)
  local v = byte(rcall('GETRANGE', key, int(tb), int(tb)), 1) or 0
  local last = tb == bb and bottom % 8 or 7
  for i = top % 8, last do  -- (the bits of one byte: at most 8)
    if floor(v / 2 ^ (7 - i)) % 2 == 1 then return tb * 8 + i end
  end
  if tb == bb then return -1 end
  local b = rcall('BITPOS', key, 1, int(tb + 1), int(bb))
  if b < 0 or b > bottom then return -1 end
  return b
end

-- The latest active second in [lo, hi] (at most two laps), or nil.
local function latest_in_lap(key, size, lo, hi)
  local top = flag_bit(size, hi)
  local b = first_set(key, top, flag_bit(size, lo))
  if b < 0 then return nil end
  return hi - (b - top)
end
local function latest_active(key, size, lo, hi)
  if lo > hi then return nil end
  local start = hi - hi % size
  if lo >= start then return latest_in_lap(key, size, lo, hi) end
  return latest_in_lap(key, size, start, hi) or latest_in_lap(key, size, lo, start - 1)
end

-- Time window: second `sec` starts, `wsec` the last one seen (0: none), `epoch` the
-- record's (`head`; 0: a record in the old layout, per-second tagged slots, which an
-- earlier version wrote). Reads only; answers whether both bitmaps are zeroed, the
-- plan of the other writes (nil: none; `write_time` makes them), the new totals and
-- epoch. A gap of a whole window, a window never used (wsec 0) or a clock gone back
-- (sec < wsec) restart: zero totals, new epoch, nothing written (the bitmaps are
-- zeroed by the first move from the epoch second: nothing reads a flag before). An
-- old-layout record, or one where an old worker wrote a slot (found here), is
-- re-based: its totals are kept, as if every call in them was made in second wsec
-- (they leave the window at wsec + S: late, never early), the epoch becomes wsec.
local function advance_time(key, sec, wsec, size, calls, failures, slow, total_ms, epoch)
  if wsec == 0 or sec < wsec or sec - wsec >= size then
    return false, nil, 0, 0, 0, 0, sec
  end
  if epoch == 0 then epoch = wsec end
  local zero = wsec == epoch
  if sec == wsec then return zero, nil, calls, failures, slow, total_ms, epoch end
  local y0, y = wsec - size, sec - size
  -- C(wsec - S), carried in slot wsec; C(sec - S), of the latest active second
  local lc, lf, ls, lms, foreign = 0, 0, 0, 0, false
  if y0 >= epoch then lc, lf, ls, lms, foreign = read_slot(key, size, wsec) end
  local a
  if y >= epoch then
    local lo = max(y0 + 1, epoch)
    if lo == y then
      if rcall('GETBIT', key, int(flag_bit(size, y))) == 1 then a = y end
    else
      a = latest_active(key, size, lo, y)
    end
  end
  local oc, of, os, oms, foreign_a = lc, lf, ls, lms, false
  if a then oc, of, os, oms, foreign_a = read_slot(key, size, a) end
  if foreign or foreign_a then
    zero, epoch, lc, lf, ls, lms, oc, of, os, oms = true, wsec, 0, 0, 0, 0, 0, 0, 0, 0
  end
  local c, f, s, ms = (calls + lc) % M32, (failures + lf) % M32, (slow + ls) % M32,
                      (total_ms + lms) % M52
  local plan = {wsec % size, time_slot(c, f, s, ms), sec % size, time_slot(oc, of, os, oms),
                flag_bit(size, wsec), nil}
  if not zero and floor(sec / size) ~= floor(wsec / size) then  -- a lap starts: its
    -- bitmap is zeroed
    plan[6] = flags_at(size) + (floor(sec / size) % 2) * flag_bytes(size)
  end
  return zero, plan, (c - oc) % M32, (f - of) % M32, (s - os) % M32, (ms - oms) % M52, epoch
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

-- The time window's writes: both bitmaps zeroed (`whole`: a restart; a kept zero
-- string), then the plan of advance_time: a lap's bitmap zeroed, slot wsec (its C) and
-- slot sec (the carried C(sec - S)): one SETRANGE when they are neighbours, and the
-- flag of wsec.
local function write_time(key, whole, size, _, plan)
  local nb = flag_bytes(size)
  if whole then rcall('SETRANGE', key, int(flags_at(size)), zeros(2 * nb)) end
  if not plan then return end
  if plan[6] then rcall('SETRANGE', key, int(plan[6]), zeros(nb)) end
  local a, b = plan[1], plan[3]
  if b == a + 1 then
    rcall('SETRANGE', key, int(WIN + TIME_SLOT * a), plan[2] .. plan[4])
  else
    rcall('SETRANGE', key, int(WIN + TIME_SLOT * a), plan[2])
    rcall('SETRANGE', key, int(WIN + TIME_SLOT * b), plan[4])
  end
  rcall('SETBIT', key, int(plan[5]), 1)
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
-- its full length, so Redis sizes the string exactly): a time window's slots and its
-- two bitmaps.
local function empty(window_type, window_size)
  if window_type == 0 then return zeros(COUNT_SLOT * window_size) end
  return zeros(TIME_SLOT * window_size + 2 * flag_bytes(window_size))
end

return {rate = rate, exceeded = exceeded, describe = describe, advance_time = advance_time,
        evicted = evicted, record_one = record_one,
        record_many = record_many, write = write,
        empty = empty}
