--!lib
-- The breaker's history entries and pub/sub messages (docs/KEY_SCHEMA.md, "History
-- stream" and "Transitions channel"). An event is {from, to, reason, failure rate,
-- slow rate, gen, actor, kind ('' for a transition), until_ms[, at_ms]}: at_ms (an
-- override's end, recorded by the first call after it) stamps the history entry,
-- which then also carries recorded_ms (now); the pub/sub message keeps now (its
-- receivers compare it with the replies they saw). Written after the
-- state, through pcall: their failure can neither abort nor undo the transition.
local pcall_, tostring, unpack = redis.pcall, tostring, unpack

local function json_str(s)
  s = string.gsub(tostring(s), '[%c"\\]',
                  function(c) return string.format('\\u%04x', string.byte(c)) end)
  return '"' .. s .. '"'
end

-- XADD each event to the history stream `K_HIST` and PUBLISH each transition on
-- `channel`; answers what failed ('' when nothing did), for the reply.
local function publish(events, K_HIST, channel, name, now)
  local event_errors = ''
  for _, e in ipairs(events) do
    local at = e[10] or now
    local entry = {'XADD', K_HIST, 'MAXLEN', '~', '1000', '*', 'from', e[1], 'to', e[2],
         'reason', e[3], 'at_ms', at, 'failure_rate', tostring(e[4]),
         'slow_rate', tostring(e[5]), 'gen', e[6], 'actor', e[7]}
    if e[8] ~= '' then entry[#entry + 1] = 'kind'; entry[#entry + 1] = e[8] end
    if e[9] and e[9] > 0 then entry[#entry + 1] = 'until_ms'; entry[#entry + 1] = e[9] end
    if at ~= now then entry[#entry + 1] = 'recorded_ms'; entry[#entry + 1] = now end
    local added = pcall_(unpack(entry))
    if type(added) == 'table' and added.err then
      event_errors = event_errors .. 'history: ' .. added.err .. '; '
    end
    if e[8] == '' then
      local published = pcall_('PUBLISH', channel, '{"name":' .. json_str(name) ..
        ',"from":"' .. e[1] .. '","to":"' .. e[2] .. '","reason":' .. json_str(e[3]) ..
        ',"at_ms":' .. now .. ',"failure_rate":' .. e[4] .. ',"slow_rate":' .. e[5] ..
        ',"gen":' .. e[6] .. ',"actor":' .. json_str(e[7]) ..
        ((e[9] > 0) and (',"until_ms":' .. e[9]) or '') .. '}')
      if type(published) == 'table' and published.err then
        event_errors = event_errors .. 'publish: ' .. published.err .. '; '
      end
    end
  end
  return event_errors
end

return {publish = publish}
