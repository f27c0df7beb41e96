local prelude_value
local function prelude()
  if prelude_value == nil then prelude_value = (function()
--!lib
-- The helpers every distbreaker script shares (one definition: lua/lib/, see
-- distbreaker/_runtime/scripts.py): the two error replies the clients decode
-- (docs/KEY_SCHEMA.md, "Errors") and the foreign-type check. Globals are looked up
-- per call: this chunk runs at a script's first call, never at FUNCTION LOAD.

-- Foreign or corrupt data in `key`: 'DISTBREAKER_SCHEMA <key> <msg>'.
local function schema_error(key, msg)
  return redis.error_reply('DISTBREAKER_SCHEMA ' .. key .. ' ' .. msg)
end

-- Arguments the script refuses: 'DISTBREAKER_ARGS <msg>'.
local function args_error(msg)
  return redis.error_reply('DISTBREAKER_ARGS ' .. msg)
end

-- The schema error for a key holding a type other than `want`; nil when it holds a
-- `want` or does not exist. TYPE costs a command: scripts run it on error paths (and
-- before writes of keys they do not read first), never on every call.
local function foreign_type(key, want)
  local found = redis.call('TYPE', key)
  if type(found) == 'table' then found = found['ok'] end
  if found ~= 'none' and found ~= want then
    return schema_error(key, 'holds a ' .. found .. ', expected a ' .. want)
  end
  return nil
end

-- A command on `key` failed with `reply`: the schema error when the key holds a type
-- other than `want`, else `reply` itself (e.g. an ACL refusal on a key of the right type).
local function failed_on(key, want, reply)
  return foreign_type(key, want) or reply
end

return {schema_error = schema_error, args_error = args_error, foreign_type = foreign_type,
        failed_on = failed_on}

end)() end
  return prelude_value
end
local main = (function(prelude)
--!module needs prelude
-- distbreaker fleet-wide fault injection (docs/KEY_SCHEMA.md, "Fault injection"). A module:
-- the helpers below are defined once and the chunk returns the entry.
--
-- An operator injects faults into every worker of a name (or of a glob of names) that
-- ALLOWS it (its config says allow_fault_injection): errors, latency or rejections at a
-- rate, for a bounded time. Workers read the injections in force (op "read", every few
-- seconds and at once when the channel says they changed) and apply them themselves;
-- the same call registers the names they allow, so the CLI can refuse an injection no
-- running worker would obey.
--
-- KEYS[1] <ns>:{inject}:fi   hash
--   f:<kind>:<selector>  an injection: "<until_ms> <spec JSON>", kind one of error,
--                        latency, reject; the JSON as the client sent it (checked here)
--   a:<name>             "<until_ms>": a worker allowing injection on <name> read the
--                        hash then (registrations last ARGV[2] ms)
--   TTL: the latest until_ms of any field (+ 1 s); expired fields are removed by every op.
-- KEYS[2] <ns>:{inject}:fi:log  stream: one entry per set / off (MAXLEN ~ 1000, 7 days)
--   fields: op, selector, kind, spec, until_ms, actor, reason
--
-- ARGV[1] op: set | off | list | read
--   set:  ARGV[2] channel, ARGV[3] selector, ARGV[4] spec JSON, ARGV[5] duration ms (> 0),
--         ARGV[6] "1": refuse unless a registered name matches, ARGV[7] actor,
--         ARGV[8] reason
--         spec: {"kind": "error"|"latency"|"reject", "rate": (0, 1], "status": 100-599
--         (error), "latency_ms": 1-600000 (latency)}; duration at most 7 days
--   A field ending more than 7 days + 1 hour from now is not ours: removed like an
--   expired one (after the call's checks, as every write).
--         reply {1, now_ms, until_ms, matched names...} or {0, now_ms} (nothing allows it)
--   off:  ARGV[2] channel, ARGV[3] selector ("" = every injection), ARGV[4] kind ("" = all
--         kinds), ARGV[5] actor, ARGV[6] reason;  reply {removed, now_ms}
--   list: reply {now_ms, field, value, field, value, ...} (live f: and a: fields)
--   read: ARGV[2] registration ms, ARGV[3..] names this worker allows;
--         reply {now_ms, field, value, ...} (live f: fields only)
-- A set or off that changed something publishes {"faults": 1, "at_ms": <now_ms>} on the
-- channel, the breakers' events channel (workers re-read at once; no "name" or "to":
-- readers of transitions skip it).
-- Selectors: '*' any run of characters, '?' one (UTF-8) character, anything else itself.

local args_error, failed_on = prelude.args_error, prelude.failed_on
local foreign_type = prelude.foreign_type

local LOG_TTL_MS = 7 * 24 * 3600 * 1000
-- The longest injection (7 days) and registration (1 hour): a field ending later is
-- not ours (foreign data), and is removed rather than keeping the hash forever.
local MAX_END_MS = 7 * 24 * 3600 * 1000 + 3600 * 1000
-- The longest injected latency (10 minutes): a worker's sleep must end.
local MAX_LATENCY_MS = 600000
local KINDS = {error = true, latency = true, reject = true}

-- One UTF-8 character (names are UTF-8 without control characters): '?' matches one
-- character, as in the Python and PHP workers, not one byte.
local UTF8_CHAR = '[\1-\127\194-\244][\128-\191]*'

-- A selector as an anchored Lua pattern.
local function glob(selector)
  local escaped = selector:gsub('[%^%$%(%)%%%.%[%]%+%-]', '%%%0')
  return '^' .. escaped:gsub('%*', '.*'):gsub('%?', UTF8_CHAR) .. '$'
end

-- The live fields of the hash, the latest end among them, and the dead ones (expired,
-- or not ours) for `prune` to remove once the call's checks passed.
local function live(K, now_ms)
  local ok, flat = pcall(redis.call, 'HGETALL', K)
  if not ok then return nil, failed_on(K, 'hash', flat) end
  local out, dead, latest = {}, {}, 0
  for i = 1, #flat, 2 do
    local until_ms = tonumber(string.match(flat[i + 1], '^(%d+)'))
    if until_ms == nil or until_ms <= now_ms or until_ms > now_ms + MAX_END_MS then
      dead[#dead + 1] = flat[i]
    else
      out[#out + 1], out[#out + 2] = flat[i], flat[i + 1]
      if until_ms > latest then latest = until_ms end
    end
  end
  return out, nil, latest, dead
end

local function prune(K, dead)
  if #dead > 0 then redis.call('HDEL', K, unpack(dead)) end
end

local function expire(K, latest, now_ms)
  if latest > now_ms then redis.call('PEXPIREAT', K, latest + 1000) end
end

local function notice(now_ms)
  return '{"faults":1,"at_ms":' .. string.format('%d', now_ms) .. '}'
end

local function log(L, now_ms, fields)
  redis.call('XADD', L, 'MAXLEN', '~', 1000, '*', unpack(fields))
  redis.call('PEXPIRE', L, LOG_TTL_MS)
end

local function check_spec(text)
  if #text > 4096 then
    return nil, args_error('bad injection spec: more than 4096 bytes')
  end
  local ok, spec = pcall(cjson.decode, text)
  if not ok or type(spec) ~= 'table' or not KINDS[spec.kind] then
    return nil, args_error('bad injection spec: kind must be error, latency or reject')
  end
  local rate = tonumber(spec.rate)
  if not rate or rate <= 0 or rate > 1 then
    return nil, args_error('bad injection spec: rate must be in (0, 1]')
  end
  local status = tonumber(spec.status)
  if spec.kind == 'error' and not (status and status >= 100 and status <= 599) then
    return nil, args_error('bad injection spec: status must be an HTTP status')
  end
  local latency = tonumber(spec.latency_ms)
  if spec.kind == 'latency' and not (latency and latency > 0 and latency <= MAX_LATENCY_MS) then
    return nil, args_error('bad injection spec: latency_ms must be in [1, ' .. MAX_LATENCY_MS
                           .. ']')
  end
  return spec
end

return function(KEYS, ARGV)
  local K, L, op = KEYS[1], KEYS[2], ARGV[1]
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if op ~= 'set' and op ~= 'off' and op ~= 'list' and op ~= 'read' then
    return args_error('unknown injection op ' .. tostring(op))
  end
  local fields, err, latest, dead = live(K, now_ms)
  if err then return err end

  if op == 'read' then
    local ttl = tonumber(ARGV[2])
    if not ttl or ttl < 1 or ttl > 3600000 then return args_error('bad registration ms') end
    prune(K, dead)
    local out, register = {now_ms}, {}
    for i = 1, #fields, 2 do
      if string.sub(fields[i], 1, 2) == 'f:' then
        out[#out + 1], out[#out + 2] = fields[i], fields[i + 1]
      end
    end
    for i = 3, #ARGV do
      register[#register + 1], register[#register + 2] = 'a:' .. ARGV[i], now_ms + ttl
    end
    if #register > 0 then
      redis.call('HSET', K, unpack(register))
      if now_ms + ttl > latest then latest = now_ms + ttl end
    end
    expire(K, latest, now_ms)
    return out
  end

  if op == 'list' then
    prune(K, dead)
    local out = {now_ms}
    for i = 1, #fields do out[#out + 1] = fields[i] end
    return out
  end

  local channel = ARGV[2]
  -- set and off write the log: its type is checked before the first write
  local foreign = foreign_type(L, 'stream')
  if foreign then return foreign end
  if op == 'set' then
    local selector, text, duration = ARGV[3] or '', ARGV[4] or '', tonumber(ARGV[5])
    if selector == '' then return args_error('empty selector') end
    if not duration or duration < 1 or duration ~= math.floor(duration)
        or duration > 7 * 24 * 3600 * 1000 then
      return args_error('duration ms must be an integer in [1, 604800000] (7 days)')
    end
    local spec, bad = check_spec(text)
    if not spec then return bad end
    local pattern, matched = glob(selector), {}
    for i = 1, #fields, 2 do
      local name = string.match(fields[i], '^a:(.*)$')
      if name and string.find(name, pattern) then matched[#matched + 1] = name end
    end
    if ARGV[6] == '1' and #matched == 0 then return {0, now_ms} end
    prune(K, dead)
    local until_ms = now_ms + duration
    redis.call('HSET', K, 'f:' .. spec.kind .. ':' .. selector, until_ms .. ' ' .. text)
    expire(K, until_ms > latest and until_ms or latest, now_ms)
    log(L, now_ms, {'op', 'set', 'selector', selector, 'kind', spec.kind, 'spec', text,
                    'until_ms', until_ms, 'actor', ARGV[7] or '', 'reason', ARGV[8] or ''})
    redis.call('PUBLISH', channel, notice(now_ms))
    local out = {1, now_ms, until_ms}
    table.sort(matched)
    for i = 1, #matched do out[#out + 1] = matched[i] end
    return out
  end

  -- off
  prune(K, dead)
  local selector, kind = ARGV[3] or '', ARGV[4] or ''
  local gone = {}
  for i = 1, #fields, 2 do
    local k, s = string.match(fields[i], '^f:(%a+):(.*)$')
    if k and (selector == '' or s == selector) and (kind == '' or k == kind) then
      gone[#gone + 1] = fields[i]
    end
  end
  if #gone > 0 then
    redis.call('HDEL', K, unpack(gone))
    log(L, now_ms, {'op', 'off', 'selector', selector == '' and '*all*' or selector,
                    'kind', kind, 'spec', '', 'until_ms', now_ms, 'actor', ARGV[5] or '',
                    'reason', ARGV[6] or ''})
    redis.call('PUBLISH', channel, notice(now_ms))
  end
  return {#gone, now_ms}
end

end)(prelude())
return main(KEYS, ARGV)
