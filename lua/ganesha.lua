--!module needs prelude
-- distbreaker Ganesha-compatible mode: ackintosh/ganesha's Rate strategy on
-- its Redis adapter layout, made atomic. One call = trim, count, decide,
-- write and status update, so no event is lost and "tripped" fires once.
--
-- KEYS[1] success zset  KEYS[2] failure zset  KEYS[3] rejection zset
-- KEYS[4] status string ("1" calmed down, "2" tripped)
-- ARGV[1] op: available | success | failure | counts
-- ARGV[2] failure rate threshold (percent)  ARGV[3] minimum requests
-- ARGV[4] time window (seconds)  ARGV[5] interval to half-open (seconds)
-- ARGV[6] unique member suffix (token)  ARGV[7] key TTL ms (0 = none, Ganesha's default)
--
-- Reply: {available (1/0), status, event ("", "tripped", "calmed_down"),
--         failures, successes, rejections, member written or ""}
-- Members are PHP's precision-14 print of microtime(true) followed by
-- ":" and the token, so PHP's (int) cast still reads the Unix second and two
-- Python events written in the same 100 microseconds never collide.

local schema_error, foreign_type, args_error = prelude.schema_error, prelude.foreign_type,
                                             prelude.args_error

-- A module (for the shared prelude): the chunk returns the entry, whose body is
-- the whole call.
return function(KEYS, ARGV)
  local K_SUCCESS, K_FAILURE, K_REJECTION, K_STATUS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  local op = ARGV[1]
  local threshold, minimum = tonumber(ARGV[2]), tonumber(ARGV[3])
  local window, half_open = tonumber(ARGV[4]), tonumber(ARGV[5])
  local token, ttl_ms = ARGV[6], tonumber(ARGV[7])

  local t = redis.call('TIME')
  local sec, usec = tonumber(t[1]), tonumber(t[2])
  local score = sec + usec / 1000000
  local score_str = sec .. '.' .. string.format('%06d', usec)

  local err = foreign_type(K_SUCCESS, 'zset') or foreign_type(K_FAILURE, 'zset')
           or foreign_type(K_REJECTION, 'zset') or foreign_type(K_STATUS, 'string')
  if err then return err end

  -- PHP prints a float with precision 14: 10 digits of seconds leave 4 decimals,
  -- rounded, trailing zeros (and a bare point) dropped.
  local function php_float(s, us)
    local frac = math.floor(us / 100 + 0.5)
    if frac >= 10000 then s, frac = s + 1, 0 end
    if frac == 0 then return tostring(s) end
    local digits = string.gsub(string.format('%04d', frac), '0+$', '')
    return s .. '.' .. digits
  end

  -- Ganesha trims members with score <= now - timeWindow.
  local horizon = string.format('%.6f', score - window)

  local function trimmed_count(key)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', horizon)
    return redis.call('ZCARD', key)
  end

  local function add(key)
    local member = php_float(sec, usec) .. ':' .. token
    redis.call('ZREMRANGEBYSCORE', key, '-inf', horizon)
    redis.call('ZADD', key, score_str, member)
    if ttl_ms > 0 then redis.call('PEXPIRE', key, ttl_ms) end
    return member
  end

  local function is_closed()
    local f = trimmed_count(K_FAILURE)
    local s = trimmed_count(K_SUCCESS)
    local r = trimmed_count(K_REJECTION)
    if f == 0 or (f / minimum) * 100 < threshold then return true, f, s, r end
    if f + s + r < minimum then return true, f, s, r end
    if (f / (f + s)) * 100 < threshold then return true, f, s, r end
    return false, f, s, r
  end

  local function load_status()
    local status = redis.call('GET', K_STATUS)
    if not status then
      status = '1'
      redis.call('SET', K_STATUS, status)
    end
    if status ~= '1' and status ~= '2' then
      return nil
    end
    return status
  end

  local function is_half_open()
    local newest = redis.call('ZREVRANGE', K_FAILURE, 0, 0)
    if not newest[1] then return false end
    local last = tonumber(string.match(newest[1], '^%d+'))
    if not last then return false end
    return (sec - last) > half_open
  end

  local status = load_status()
  if not status then
    return schema_error(K_STATUS, 'holds an unknown status')
  end

  local event, member, available = '', '', 1
  local closed, f, s, r
  if op == 'available' then
    closed, f, s, r = is_closed()
    if not closed and not is_half_open() then
      available = 0
      member = add(K_REJECTION)
      r = r + 1
    end
  elseif op == 'failure' then
    member = add(K_FAILURE)
    closed, f, s, r = is_closed()
    if status == '1' and not closed then
      status = '2'
      redis.call('SET', K_STATUS, status)
      event = 'tripped'
    end
    available = closed and 1 or 0
  elseif op == 'success' then
    member = add(K_SUCCESS)
    if status == '2' then
      status = '1'
      redis.call('SET', K_STATUS, status)
      event = 'calmed_down'
    end
    closed, f, s, r = is_closed()
    available = closed and 1 or 0
  elseif op == 'counts' then
    closed, f, s, r = is_closed()
    available = (closed or is_half_open()) and 1 or 0
  else
    return args_error('unknown op ' .. tostring(op))
  end
  if ttl_ms > 0 then redis.call('PEXPIRE', K_STATUS, ttl_ms) end
  return {available, status, event, f, s, r, member}
end
