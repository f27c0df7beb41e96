--!module needs breaker bulkhead budget
-- distbreaker Policy finish: several calls of the breaker, bulkhead and budget
-- scripts in ONE call (FCALL distbreaker_<hash>_policy; EVAL form: this file
-- after the three scripts it needs), run in order, each exactly as if it had
-- been called alone. After a Policy attempt: the budget deposit, the bulkhead
-- release and the breaker record, one script call instead of three.
--
-- ARGV[1] count of calls c (>= 1); then for each call i: ARGV[3i - 1] script
-- name (breaker | bulkhead | budget), ARGV[3i] its key count, ARGV[3i + 1] its
-- argument count; then every call's ARGV in order. KEYS: every call's KEYS in
-- order (one cluster slot: all under one name's hash tag).
-- Reply: an array of the c replies, in order. A call that fails (its own error
-- reply, or an error raised inside it, e.g. a write refused for OOM) has its
-- error in its place; the calls after it still run (as in a pipeline).

local RUN = {breaker = breaker, bulkhead = bulkhead, budget = budget}

local function as_error(e)
  if type(e) == 'table' and e['err'] then return e end
  return {err = 'ERR ' .. tostring(e)}
end

return function(KEYS, ARGV)
  local count = tonumber(ARGV[1])
  if not count or count < 1 or count ~= math.floor(count) then
    return redis.error_reply('DISTBREAKER_ARGS bad policy call count')
  end
  -- Check the whole header before running anything; keep the counts.
  local counts = {}
  local nkeys, nargs = 0, 1 + 3 * count
  for c = 1, count do
    local nk, na = tonumber(ARGV[3 * c]), tonumber(ARGV[3 * c + 1])
    if not RUN[ARGV[3 * c - 1]] or not nk or nk < 0 or not na or na < 0 then
      return redis.error_reply('DISTBREAKER_ARGS bad policy call header for call ' .. c)
    end
    counts[2 * c - 1], counts[2 * c] = nk, na
    nkeys, nargs = nkeys + nk, nargs + na
  end
  if nkeys ~= #KEYS or nargs ~= #ARGV then
    return redis.error_reply('DISTBREAKER_ARGS policy call counts do not match KEYS/ARGV')
  end
  local replies = {}
  local ki, ai = 1, 2 + 3 * count
  for c = 1, count do
    local nk, na = counts[2 * c - 1], counts[2 * c]
    local ok, reply = pcall(RUN[ARGV[3 * c - 1]], {unpack(KEYS, ki, ki + nk - 1)},
                            {unpack(ARGV, ai, ai + na - 1)})
    ki, ai = ki + nk, ai + na
    if ok then replies[c] = reply else replies[c] = as_error(reply) end
  end
  return replies
end
