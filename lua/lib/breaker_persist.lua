--!lib needs record_layout record_codec
-- The breaker's writes beyond the window (lua/breaker.lua decides what to write, in
-- which order; docs/KEY_SCHEMA.md documents every byte): the state record's header
-- groups as bytes, the meta hash, the quorum marks, the probe leases, the TTLs.
-- Explicit data flow: each function takes the keys and values it writes (no upvalue
-- is shared with lua/breaker.lua).
--
-- Header groups, their fields in the layout's order (lua/lib/record_layout.lua):
-- counters, config (with the half-open figures, magic and fingerprint between its
-- fields), half_open alone, state (state and window totals). The state group ends
-- with `seq`, which changes on every write, and the cumulative counters, which change
-- on every record: Lua 5.1 hashes only some bytes of a long string (the last one
-- always), and strings that differ only elsewhere would all collide in its string table.
local max, unpack, rep = math.max, unpack, string.rep
local rcall = redis.call
local layout = record_layout
local MAGIC, STATE_FIELDS = layout.MAGIC, layout.STATE_FIELDS
local packer, encode, int = record_codec.packer, record_codec.encode, record_codec.int
local CODE = {}  -- state name -> code
for code, state_name in ipairs(layout.STATES) do CODE[state_name] = code - 1 end

local STATE_FORMAT = '>' .. rep('i8', STATE_FIELDS)
local function header_state(code, since, override_until, ttl_refreshed_at, calls, failures, slow,
                            total_ms, head, window_sec, seq, calls_total, failures_total)
  if packer then
    return packer.pack(STATE_FORMAT, code, since, override_until, ttl_refreshed_at, calls,
                       failures, slow, total_ms, head, window_sec, seq, calls_total,
                       failures_total)
  end
  return encode({code, since, override_until, ttl_refreshed_at, calls, failures, slow,
                 total_ms, head, window_sec, seq, calls_total, failures_total}, 1,
                STATE_FIELDS, 8)
end

-- `g`: the cold group (lua/breaker.lua's `cold()`).
local function header_counters(g)
  return encode({g.open_until, g.gen, g.opens, g.rejected, g.slow_total, g.drift_fp}, 1,
                layout.COUNTERS_FIELDS, 8)
end

local function header_config(g, hp_done, hp_fail, hp_slow, probes_max, lease_ms, max_half_open,
                             fp, window_type, window_size, min_calls, failure_threshold,
                             slow_threshold, ttl_ms)
  return encode({g.open_wait, CODE[g.initial_state], CODE[g.after_half_open], g.wait_mult,
                 g.max_open_wait, g.wait_rnd, g.slow_ms, hp_done, hp_fail, hp_slow, probes_max,
                 lease_ms, max_half_open, MAGIC, fp, window_type, window_size, min_calls,
                 failure_threshold, slow_threshold, ttl_ms}, 1, layout.CONFIG_FIELDS, 8)
end

local function header_half_open(hp_done, hp_fail, hp_slow)
  return encode({hp_done, hp_fail, hp_slow}, 1, layout.HALF_OPEN_FIELDS, 8)
end

-- The meta hash (after the state record): the state's reason and actor, the stored
-- config, the drifting config and when it was seen (each when its flag is set), or
-- the drift cleared.
local function write_meta(key, meta_reason, reason, actor, meta_cfg, cfg, meta_drift, drift_cfg,
                          now, clear_drift)
  if meta_reason or meta_cfg or meta_drift then
    local m, k = {}, 0
    if meta_reason then m[1], m[2], m[3], m[4], k = 'reason', reason, 'actor', actor, 4 end
    if meta_cfg then m[k + 1], m[k + 2], k = 'cfg', cfg, k + 2 end
    if meta_drift then
      m[k + 1], m[k + 2], m[k + 3], m[k + 4], k = 'drift_cfg', drift_cfg, 'drift_at', now, k + 4
    end
    rcall('HSET', key, unpack(m, 1, k))
  end
  if clear_drift then rcall('HDEL', key, 'drift_cfg', 'drift_at') end
end

-- The quorum marks (hash <state key>:fw): deleted with the window, or this worker's
-- failure marked.
local function write_quorum_marks(state_key, clear, mark, now, ttl_ms)
  local k_fw = state_key .. ':fw'
  if clear then
    rcall('DEL', k_fw)
  elseif mark then
    rcall('HSET', k_fw, mark, int(now))
    rcall('PEXPIRE', k_fw, int(ttl_ms))
  end
end

-- The probe leases (zset): cleared, or expired ones reaped as a new one comes; the
-- token whose probe ended leaves; a new lease runs until now + lease_ms.
local function write_probes(key, clear, add, rem, now, lease_ms)
  if clear then
    rcall('DEL', key)
  elseif add then
    rcall('ZREMRANGEBYSCORE', key, '-inf', int(now))
  end
  if rem then rcall('ZREM', key, rem) end
  if add then rcall('ZADD', key, int(now + lease_ms), add) end
end

-- The TTL of every key but the history: key_ttl, or until key_ttl past a later end
-- (`held`: an override, a long OPEN wait); answers that TTL (as the decimal string),
-- which the caller gives the history after its XADD (a first event creates the stream).
-- `probes_key` false: the probe leases are left alone (none are live). The meta hash
-- holds the config rollout too (a worker's repeated hello writes it without a PEXPIRE).
local function refresh_ttls(state_key, meta_key, probes_key, now, ttl_ms, held)
  local keep = ttl_ms
  if held > now then keep = max(ttl_ms, held - now + ttl_ms) end
  -- formatted once, as an integer (a number argument is formatted by Lua's %.14g for
  -- each command, several times the cost)
  keep = int(keep)
  rcall('PEXPIRE', state_key, keep)
  rcall('PEXPIRE', meta_key, keep)
  if probes_key then rcall('PEXPIRE', probes_key, keep) end
  return keep
end

return {header_state = header_state, header_counters = header_counters,
        header_config = header_config, header_half_open = header_half_open,
        write_meta = write_meta, write_quorum_marks = write_quorum_marks,
        write_probes = write_probes, refresh_ttls = refresh_ttls}
