--!lib
-- Outcome recording (docs/KEY_SCHEMA.md, "Outcome recording"): a record call the
-- client sampled carries ARGV[12] '<maxlen>;<ttl_ms>;<rate_ppm>;<worker>', and this
-- module appends its outcome to the capped stream <state key>:rec in the same script
-- call (no round trip of its own). Calls without ARGV[12] never reach this module:
-- lua/breaker.lua tests the argument once, after the hot path answered.
-- Best effort: written after the state, through pcall; a malformed spec or a foreign
-- key is skipped, never an error of the record it rides on.
-- The run-time switch (`distbreaker record start`) is the hash <state key>:rec:on
-- (`v`: rate;until;max;ttl, for hellos; expiring at `until`); a worker learns it from the full reply
-- to its hello (`control`, element 21), which is the usual reply while there is none.
local tonumber, pcall_, match = tonumber, redis.pcall, string.match

local MAX_LEN = 1000000   -- entries, at most (the client's cap is validated too)
local MIN_TTL = 1000      -- ms

-- Appends one sampled outcome: `ok`, `f`, `s`, `ms` as the record's ARGV[7..10]
-- (texts, already validated), at server ms `now`, `st` the state after the call.
local function add(k_state, spec, now, ok, f, s, ms, st)
  local maxlen, ttl, rate, worker = match(spec, '^(%d+);(%d+);(%d+);(.*)$')
  maxlen, ttl = tonumber(maxlen), tonumber(ttl)
  if not maxlen or maxlen < 1 or maxlen > MAX_LEN or ttl < MIN_TTL then return end
  local key = k_state .. ':rec'
  local added = pcall_('XADD', key, 'MAXLEN', '~', maxlen, '*', 't', now, 'ok', ok, 'f', f,
                       's', s, 'ms', ms, 'w', worker, 'r', rate, 'st', st)
  if type(added) == 'table' and added.err then return end
  pcall_('PEXPIRE', key, ttl)
end

-- A hello's answer about the run-time switch: its field `v`
-- '<rate_ppm>;<until_ms>;<maxlen>;<ttl_ms>' while the switch hash exists (`record stop`
-- leaves rate 0 for a minute, so every worker's next hello hears it), else nil: the
-- hello's reply is then as before. One HGET (every 20 s per worker).
local function control(k_state)
  local v = pcall_('HGET', k_state .. ':rec:on', 'v')
  if type(v) ~= 'string' then return nil end
  return v
end

return {add = add, control = control}
