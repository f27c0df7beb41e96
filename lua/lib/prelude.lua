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
