--!lib needs record_codec breaker_config
-- Config rollouts (docs/OPERATIONS.md, "Changing a breaker's config"): which config is
-- in force while workers with different configs run side by side. Explicit data flow:
-- lua/breaker.lua passes the values and applies the answer (adopting, writing after
-- the state record).
--
-- The rollout fields live in the meta hash <state key>:meta (docs/KEY_SCHEMA.md; one
-- key fewer per breaker than a hash of their own): per worker instance that said hello
-- (ARGV[2] '<fp>@<worker>'), 'w:<worker>' -> '<fp>:<last hello ms>'; per config
-- fingerprint, 'd:<fp>' -> when it was deployed (the hello of a new worker instance
-- running it while no other live worker did: a first deploy, or a rollback after its
-- workers had gone) and, for configs other than the one in force (whose wire is the
-- meta hash's 'cfg'), 'c:<fp>' -> its wire string; and 'f:at', 'f:why', 'f:actor':
-- when, why and by whom the config in force was adopted (none: it is the first config
-- stored, in force since its 'd:').
--
-- Mixed fleets: clients before this layout kept these fields in a hash of their own,
-- <state key>:cfgs (LEGACY). While that key exists (an older worker's hellos keep it
-- alive), a hello reads it too (the union: every worker of both versions counts) and
-- writes its own fields there as well, so older workers see the newer ones and neither
-- takes its config back from the other. This code never refreshes that key's TTL: once
-- the last older worker is gone it expires (key_ttl) and nothing reads it any more.
--
-- The rule, decided on hellos only (a worker's first call, then one every 20 s; its
-- other calls cost nothing more; a repeated hello of a worker whose config is in force
-- decides nothing and costs one HSET and one EXISTS, `rehello`): the caller's config
-- replaces the one in force when it ranks higher (config field 22, the explicit
-- version, first; then the deploy time: the newest deployment wins), or when no worker
-- runs the one in force any more (each said goodbye, '<fp>@<worker>@bye' from
-- `close()`, or has been silent for FORGET_MS). A worker counts as running its config
-- (for deploys and for readers' counts) for LIVE_MS after its last hello.
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

-- The rollout fields of one HGETALL reply into `state` (a later worker entry wins).
local function parse(raw, state)
  local workers, deployed, wires = state.workers, state.deployed, state.wires
  for i = 1, #raw, 2 do
    local field, value = raw[i], raw[i + 1]
    local kind, id = sub(field, 1, 2), sub(field, 3)
    if kind == 'w:' then
      local fp, seen = match(value, '^(%d+):(%d+)$')
      if fp and not (workers[id] and workers[id][2] >= tonumber(seen)) then
        workers[id] = {fp, tonumber(seen)}
      end
    elseif kind == 'd:' then
      deployed[id] = tonumber(value) or 0
    elseif kind == 'c:' then
      wires[id] = value
    elseif field == 'cfg' then
      state.cfg = value
    end
  end
end

-- The rollout fields as tables (the meta hash's, over the legacy hash's while that
-- exists: `legacy` true), or nil and the raw error (the meta hash of a foreign type; a
-- legacy key of a foreign type is ignored).
local function read(key, legacy_key)
  local raw = pcall_('HGETALL', key)
  if type(raw) == 'table' and raw.err then return nil, raw.err end
  local state = {workers = {}, deployed = {}, wires = {}, legacy = false}
  local old = pcall_('HGETALL', legacy_key)
  if type(old) == 'table' and not old.err and #old > 0 then
    state.legacy = true
    parse(old, state)
  end
  parse(raw, state)
  return state
end

local function live(state, fp, now, except)
  for id, w in pairs(state.workers) do
    if id ~= except and w[1] == fp and now - w[2] <= LIVE_MS then return true end
  end
  return false
end

-- Why the hello of `mine` replaces `stored` as the config in force (nil: it does not).
local function adoption(state, running, mine, mine_wire, stored, stored_wire, deployed_now)
  if mine == stored or stored == '0' then return nil end
  -- orphaned: every worker that ran the config in force said goodbye or has been silent
  -- for FORGET_MS (not merely LIVE_MS: a fleet waiting out a long OPEN makes no calls)
  if not running[stored] then return 'no worker runs the config in force' end
  local vm, vs = version_of(mine_wire), version_of(stored_wire)
  if vm > vs then return 'higher config version' end
  -- Deployed in the same millisecond: the newer is the one this hello deploys (a later
  -- hello of a config deployed in that millisecond must not take it back: with `>=`
  -- every hello of either config flipped the config in force).
  local dm, ds = state.deployed[mine] or 0, state.deployed[stored] or 0
  if vm == vs and (dm > ds or (dm == ds and deployed_now)) then return 'newest deployment' end
  return nil
end

-- The wire strings a hello stores: 'c:<fp>' only for configs not in force (the meta
-- hash's 'cfg' holds that one's wire; a reader takes it from there). An adoption (`why`)
-- stores the wire of the config it replaces and drops the adopted one's; a 'c:' field
-- of the config in force (written by older clients) is dropped.
local function with_wires(writes, why, state, mine, mine_wire, stored, stored_wire)
  local hset, hdel = writes.hset, writes.hdel
  if why or mine == stored then
    if state.wires[mine] then hdel[#hdel + 1] = 'c:' .. mine end
  elseif state.wires[mine] ~= mine_wire then
    hset[#hset + 1], hset[#hset + 2] = 'c:' .. mine, mine_wire
  end
  if why and stored ~= '0' and stored_wire and state.wires[stored] ~= stored_wire then
    hset[#hset + 1], hset[#hset + 2] = 'c:' .. stored, stored_wire
  elseif not why and mine ~= stored and state.wires[stored] then
    hdel[#hdel + 1] = 'c:' .. stored
  end
  return writes, why
end

-- A hello (or goodbye) of `worker` running config `mine` (fingerprint text, wire)
-- while `stored` (text, '0' for none; wire, nil: the meta hash's `cfg`, read with the
-- rollout fields) is in force. `key`: the meta hash, `legacy_key`: <state key>:cfgs.
-- Returns the writes to make after the state record (a table for `write`), why `mine`
-- is adopted (nil: it is not), or nil, nil and an error reply.
local function hello(key, legacy_key, worker, bye, mine, mine_wire, stored, stored_wire, now,
                     fresh)
  local state, err = read(key, legacy_key)
  if not state then return nil, nil, err end
  stored_wire = stored_wire or state.cfg
  local hset, hdel = {}, {}
  if bye then
    hdel[1] = 'w:' .. worker
    return {hset = hset, hdel = hdel, legacy = state.legacy}, nil
  end
  local deployed_now = false  -- this hello deploys `mine`
  -- (`fresh`: this call's `rehello` just created the worker's entry)
  if (fresh or not state.workers[worker]) and not live(state, mine, now, worker) then
    state.deployed[mine], deployed_now = now, true
    hset[#hset + 1], hset[#hset + 2] = 'd:' .. mine, int(now)
  end
  state.workers[worker] = {mine, now}
  hset[#hset + 1], hset[#hset + 2] = 'w:' .. worker, mine .. ':' .. int(now)
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
  for _, known in ipairs({state.wires, state.deployed}) do  -- (the one in force has no c:)
    for fp in pairs(known) do
      if not running[fp] and fp ~= stored and fp ~= mine then
        hdel[#hdel + 1], hdel[#hdel + 2] = 'c:' .. fp, 'd:' .. fp
      end
    end
  end
  local writes = {hset = hset, hdel = hdel, legacy = state.legacy}
  return with_wires(writes, adoption(state, running, mine, mine_wire, stored, stored_wire,
                                     deployed_now), state, mine, mine_wire, stored, stored_wire)
end

-- The writes `hello` planned, plus the adoption's (`why`, `actor`; `deploy`: the
-- adopted config's fingerprint text and wire, an operator's adoption making it the
-- newest deployment), to the meta hash `key`, and to the legacy hash too while it
-- exists (`writes.legacy`; without a hello, an adoption asks). After the state record.
local function write(key, legacy_key, writes, why, actor, adopted, adopted_wire, deploy, now,
                     ttl_ms)
  local hset = writes and writes.hset or {}
  -- the first config stored writes no 'f:' fields: none means just that, since its
  -- 'd:' (every breaker has one: ~40 bytes each spared)
  local first = why == 'first config'
  if why and not first then
    hset[#hset + 1], hset[#hset + 2] = 'f:at', int(now)
    hset[#hset + 1], hset[#hset + 2] = 'f:why', why
    if actor and actor ~= '' then hset[#hset + 1], hset[#hset + 2] = 'f:actor', actor end
    if deploy then hset[#hset + 1], hset[#hset + 2] = 'd:' .. adopted, int(now) end
  end
  local hdel = writes and writes.hdel or {}
  -- the config in force keeps no 'c:' field (the meta hash holds its wire)
  -- (nor an empty 'f:actor': no field is the same to readers, and spares ~11 bytes)
  if why then
    hdel[#hdel + 1] = 'c:' .. adopted
    if first then
      hdel[#hdel + 1], hdel[#hdel + 2], hdel[#hdel + 3] = 'f:at', 'f:why', 'f:actor'
    elseif not actor or actor == '' then
      hdel[#hdel + 1] = 'f:actor'
    end
  end
  if #hdel > 0 then redis.call('HDEL', key, unpack(hdel)) end
  if #hset > 0 then
    redis.call('HSET', key, unpack(hset))
    redis.call('PEXPIRE', key, int(ttl_ms))
  end
  local legacy = writes and writes.legacy
  if legacy == nil then legacy = redis.call('EXISTS', legacy_key) == 1 end
  if legacy then  -- (no PEXPIRE: the older workers keep it alive, or it expires)
    if #hdel > 0 then pcall_('HDEL', legacy_key, unpack(hdel)) end
    if #hset > 0 then pcall_('HSET', legacy_key, unpack(hset)) end
  end
end

-- A repeated hello of a worker whose config (`fp`, its text; `wire`) is in force, made
-- after the state record (`key`: the meta hash; `legacy_key`: <state key>:cfgs): the
-- rule can adopt nothing (the config is in force), so the hello only says the worker
-- still runs it: one HSET of its entry's time in the meta hash (whose TTL is refreshed
-- with the record's, lua/lib/breaker_persist.lua), and the same in the legacy hash
-- while that exists (an EXISTS: older workers must keep seeing this one). When that
-- created the entry (`fresh`: the hot path's HSET did; the hash expired, or the worker
-- was forgotten after FORGET_MS of silence) the whole hello runs, which may deploy the
-- config.
-- Through pcall: a foreign key type only loses the hello, never the call (the
-- worker's next full hello reports it).
local function rehello(key, legacy_key, worker, fp, wire, now, ttl_ms, fresh)
  if not fresh then
    local entry = fp .. ':' .. int(now)
    local added = pcall_('HSET', key, 'w:' .. worker, entry)
    if pcall_('EXISTS', legacy_key) == 1 then
      pcall_('HSET', legacy_key, 'w:' .. worker, entry)
    end
    if added ~= 1 then return end
  end
  local writes = hello(key, legacy_key, worker, false, fp, wire, fp, wire, now, true)
  if writes then
    pcall(write, key, legacy_key, writes, nil, nil, nil, nil, nil, now, ttl_ms)
  end
end

return {split = split, version_of = version_of, hello = hello, write = write,
        rehello = rehello, LIVE_MS = LIVE_MS}
