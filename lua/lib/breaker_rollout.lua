--!lib needs record_codec breaker_config
-- Config rollouts (docs/OPERATIONS.md, "Changing a breaker's config"): which config is
-- in force while workers with different configs run side by side. Explicit data flow:
-- lua/breaker.lua passes the values and applies the answer (adopting, writing after
-- the state record).
--
-- The rollout hash <state key>:cfgs (docs/KEY_SCHEMA.md) holds, per worker instance
-- that said hello (ARGV[2] '<fp>@<worker>'), 'w:<worker>' -> '<fp>:<last hello ms>';
-- per config fingerprint, 'd:<fp>' -> when it was deployed (the hello of a new
-- worker instance running it while no other live worker did: a first deploy, or a
-- rollback after its workers had gone) and 'c:<fp>' -> its wire string; and 'f:at',
-- 'f:why', 'f:actor': when, why and by whom the config in force was adopted.
--
-- The rule, decided on hellos only (a worker's first call, then one every 20 s; its
-- other calls cost nothing more; a repeated hello of a worker whose config is in force
-- decides nothing and costs one HSET, `rehello`): the caller's config replaces the one in force when
-- it ranks higher (config field 22, the explicit version, first; then the deploy
-- time: the newest deployment wins), or when no worker runs the one in force any more
-- (each said goodbye, '<fp>@<worker>@bye' from `close()`, or has been silent for
-- FORGET_MS). A worker counts as running its config (for deploys and for readers'
-- counts) for LIVE_MS after its last hello.
local tonumber, pairs, unpack, pcall_ = tonumber, pairs, unpack, redis.pcall
local sub, find, match = string.sub, string.find, string.match
local int, wire_field = record_codec.int, breaker_config.field

local LIVE_MS = 60000     -- a worker counts as running its config this long after a hello
local FORGET_MS = 600000  -- a worker's entry is dropped this long after its last hello

-- ARGV[2]: '<fp>', '<fp>@<worker>' (hello) or '<fp>@<worker>@bye'. Returns the
-- fingerprint's text, the worker (nil: no hello) and whether it says goodbye.
local function split(arg)
  local at = find(arg, '@', 1, true)
  if not at then return arg, nil, false end
  local rest = sub(arg, at + 1)
  if sub(rest, -4) == '@bye' then return sub(arg, 1, at - 1), sub(rest, 1, -5), true end
  return sub(arg, 1, at - 1), rest, false
end

-- A wire string's explicit version (config field 22; 0 when absent).
local function version_of(wire)
  if not wire or wire == '' then return 0 end
  return tonumber(wire_field(wire, 22) or '') or 0
end

-- The rollout hash as tables, or nil and the raw error (a foreign key type).
local function read(key)
  local raw = pcall_('HGETALL', key)
  if type(raw) == 'table' and raw.err then return nil, raw.err end
  local workers, deployed, wires = {}, {}, {}
  for i = 1, #raw, 2 do
    local field, value = raw[i], raw[i + 1]
    local kind, id = sub(field, 1, 2), sub(field, 3)
    if kind == 'w:' then
      local fp, seen = match(value, '^(%d+):(%d+)$')
      if fp then workers[id] = {fp, tonumber(seen)} end
    elseif kind == 'd:' then
      deployed[id] = tonumber(value) or 0
    elseif kind == 'c:' then
      wires[id] = value
    end
  end
  return {workers = workers, deployed = deployed, wires = wires}
end

local function live(state, fp, now, except)
  for id, w in pairs(state.workers) do
    if id ~= except and w[1] == fp and now - w[2] <= LIVE_MS then return true end
  end
  return false
end

-- A hello (or goodbye) of `worker` running config `mine` (fingerprint text, wire)
-- while `stored` (text, '0' for none; wire) is in force. Returns the writes to make
-- after the state record (a table for `write`), why `mine` is adopted (nil: it is
-- not), or nil, nil and an error reply.
local function hello(key, worker, bye, mine, mine_wire, stored, stored_wire, now, fresh)
  local state, err = read(key)
  if not state then return nil, nil, err end
  local hset, hdel = {}, {}
  if bye then
    hdel[1] = 'w:' .. worker
    return {hset = hset, hdel = hdel}, nil
  end
  local deployed_now = false  -- this hello deploys `mine`
  -- (`fresh`: this call's `rehello` just created the worker's entry)
  if (fresh or not state.workers[worker]) and not live(state, mine, now, worker) then
    state.deployed[mine], deployed_now = now, true
    hset[#hset + 1], hset[#hset + 2] = 'd:' .. mine, int(now)
  end
  state.workers[worker] = {mine, now}
  hset[#hset + 1], hset[#hset + 2] = 'w:' .. worker, mine .. ':' .. int(now)
  if state.wires[mine] ~= mine_wire then
    hset[#hset + 1], hset[#hset + 2] = 'c:' .. mine, mine_wire
  end
  if stored ~= '0' and stored_wire and not state.wires[stored] then
    hset[#hset + 1], hset[#hset + 2] = 'c:' .. stored, stored_wire
  end
  -- forget workers gone long ago, and configs that no worker entry runs any more
  local running = {}
  for id, w in pairs(state.workers) do
    if now - w[2] > FORGET_MS then
      hdel[#hdel + 1] = 'w:' .. id
      state.workers[id] = nil
    else
      running[w[1]] = true
    end
  end
  for fp in pairs(state.wires) do
    if not running[fp] and fp ~= stored and fp ~= mine then
      hdel[#hdel + 1], hdel[#hdel + 2] = 'c:' .. fp, 'd:' .. fp
    end
  end
  local writes = {hset = hset, hdel = hdel}
  if mine == stored or stored == '0' then return writes, nil end
  -- orphaned: every worker that ran the config in force said goodbye or has been silent
  -- for FORGET_MS (not merely LIVE_MS: a fleet waiting out a long OPEN makes no calls)
  if not running[stored] then
    return writes, 'no worker runs the config in force'
  end
  local vm, vs = version_of(mine_wire), version_of(stored_wire)
  if vm > vs then return writes, 'higher config version' end
  -- Deployed in the same millisecond: the newer is the one this hello deploys (a later
  -- hello of a config deployed in that millisecond must not take it back: with `>=`
  -- every hello of either config flipped the config in force).
  local dm, ds = state.deployed[mine] or 0, state.deployed[stored] or 0
  if vm == vs and (dm > ds or (dm == ds and deployed_now)) then
    return writes, 'newest deployment'
  end
  return writes, nil
end

-- The writes `hello` planned, plus the adoption's (`why`, `actor`; `deploy`: the
-- adopted config's fingerprint text and wire, an operator's adoption making it the
-- newest deployment). After the state record.
local function write(key, writes, why, actor, adopted, adopted_wire, deploy, now, ttl_ms)
  local hset = writes and writes.hset or {}
  if why then
    hset[#hset + 1], hset[#hset + 2] = 'f:at', int(now)
    hset[#hset + 1], hset[#hset + 2] = 'f:why', why
    hset[#hset + 1], hset[#hset + 2] = 'f:actor', actor or ''
    hset[#hset + 1], hset[#hset + 2] = 'c:' .. adopted, adopted_wire
    if deploy then hset[#hset + 1], hset[#hset + 2] = 'd:' .. adopted, int(now) end
  end
  if writes and #writes.hdel > 0 then redis.call('HDEL', key, unpack(writes.hdel)) end
  if #hset > 0 then
    redis.call('HSET', key, unpack(hset))
    redis.call('PEXPIRE', key, int(ttl_ms))
  end
end

-- A repeated hello of a worker whose config (`fp`, its text; `wire`) is in force, made
-- after the state record: the rule can adopt nothing (the config is in force), so the
-- hello only says the worker still runs it: one HSET of its entry's time (the hash's
-- TTL is refreshed with the record's, lua/lib/breaker_persist.lua). When that created
-- the entry (`fresh`: the hot path's HSET did; the hash expired, or the worker was
-- forgotten after FORGET_MS of silence) the whole hello runs, which may deploy the
-- config. Through pcall: a foreign key type only loses the hello, never the call
-- (the worker's next full hello reports it).
local function rehello(key, worker, fp, wire, now, ttl_ms, fresh)
  if not fresh then
    local added = pcall_('HSET', key, 'w:' .. worker, fp .. ':' .. int(now))
    if added ~= 1 then return end
  end
  local writes = hello(key, worker, false, fp, wire, fp, wire, now, true)
  if writes then pcall(write, key, writes, nil, nil, nil, nil, nil, now, ttl_ms) end
end

return {split = split, version_of = version_of, hello = hello, write = write,
        rehello = rehello, LIVE_MS = LIVE_MS}
