--!module needs prelude
-- distbreaker fleet-wide bulkhead: a Redis semaphore of leases. A module: the
-- helpers below are defined once (at FUNCTION LOAD, or once per EVAL) and the
-- chunk returns the entry function.
--
-- Keys (all under the name's hash tag, like the breaker's):
-- KEYS[1] leases  <ns>:{<name>}:bh         zset  member = holder token (any
--                       string; Python uses 24 hex chars), score = lease deadline (server ms)
-- KEYS[2] meta    <ns>:{<name>}:bh:meta    hash  counters and registered waiters:
--                       rejected  calls refused (full on a fail-fast or last-try acquire)
--                       acquired  permits granted
--                       lost      renewals or releases that found their lease gone
--                       limit     max_concurrent_calls of the last writing caller
--                                 (informational: each call's ARGV[3] governs it)
--                       w:<token> a waiter's deadline (server ms), reaped when passed
-- KEYS[3] notify  <ns>:{<name>}:bh:notify  list  one element ("1") per wake-up
--                       owed to waiters; a refused waiter BLPOPs it with a timeout of at
--                       most min(its remaining wait, next_deadline_in_ms), then acquires again
-- TTLs: PEXPIRE key ttl (ARGV[5]) on the meta hash whenever an op writes it, on the
-- leases zset whenever a lease is added or renewed (a removal keeps the TTL, which
-- covers every deadline left in it), on the notify list whenever wake-ups are
-- pushed. An empty zset or list simply does not exist. Foreign types give
-- 'DISTBREAKER_SCHEMA <key> ...', always before the op's first write.
--
-- ARGV[1] op: acquire | release | renew | cancel | metrics
-- ARGV[2] holder token ("" for metrics; acquire needs one)
-- ARGV[3] max_concurrent_calls (integer >= 1)
-- ARGV[4] lease ms (>= 1; acquire, renew: the new deadline is now + lease)
-- ARGV[5] key ttl ms (>= 1)
-- ARGV[6] acquire: wait ms; 0 = fail fast or last try (when full: counts a rejection
--         and unregisters the token as a waiter), > 0 = when full, register (or
--         refresh) the token as a waiter until now + wait ms (Python sends its
--         remaining wait + 1000 ms of grace); other ops: 0 (optional, default 0)
--
-- ARGV[7] adaptive limit ("" = the fixed limit ARGV[3]): "min,max,initial,backoff,
--         tolerance,smoothing" (backoff, tolerance, smoothing in millionths); the limit
--         then lives in meta (fields a_*, see docs/ADAPTIVE.md) and moves with the
--         outcomes releases report, by server time, within [min, max]
-- ARGV[8] acquire: the share of the limit this call's priority may use, in millionths
--         (1000000: all of it; "" = all); release: the outcome ("" none, "ok", "drop"
--         for a failure or timeout, "429" for an overload answer)
-- ARGV[9] release: the call's latency ms     ARGV[10] release: Retry-After ms of a 429
-- ARGV[11] release, optional: how many successes an "ok" stands for (a sample; default 1)
-- op restart: the adaptive limit restarts at its minimum (slow start after a recovery)
--
-- Every op reads TIME once, then, before any write: HMGET of the four counters
-- and HLEN of meta; only when meta holds other fields (registered waiters) the
-- whole hash (HGETALL) and the notify length (LLEN); the earliest lease (ZRANGE
-- 0 0). Then it reaps expired leases (ZREMRANGEBYSCORE -inf now, only when the
-- earliest has expired) and waiters whose deadline passed, and ends by making the
-- notify list hold exactly min(free permits, waiters) elements, so a release (or
-- a reaped lease) wakes one waiter, and no stale wake-up outlives the free permit
-- it announced. With no waiter registered the list is owed nothing and is not
-- read (every op that leaves no waiter behind leaves it empty).
--
-- Reply (all integers): {ok, in_use, limit, waiting, rejected, next_deadline_in_ms,
--                        now_ms, lost, acquired}
--   ok: acquire 1 = granted (also when the token already held a lease: it is
--       refreshed), 0 = full; release 1 = the lease was held, 0 = it had expired
--       or vanished (counted as lost); renew 1 = renewed, 0 = lost (counted);
--       cancel (an interrupted acquire: drops the token's lease, if granted, and its
--       waiter registration, counting nothing), metrics: 1
--   next_deadline_in_ms: ms until the earliest lease deadline (0: no lease), the
--       longest a waiter needs to block before a reaped lease may free a permit.

local OPS = {acquire = true, release = true, renew = true, cancel = true, metrics = true,
             restart = true}
local COUNTERS = {'rejected', 'acquired', 'lost', 'limit', 'waiters', 'ttl_until'}

local schema_error, failed_on, bad_args = prelude.schema_error, prelude.failed_on,
                                         prelude.args_error

-- The leases zset's keep-alive member (never a token: clients choose hex tokens): the
-- fast acquire adds it with score 0, so releasing the last lease leaves the zset (and
-- its TTL) in place; the fast path's reap keeps it, the general path's (score <= now)
-- removes it like any expired lease (the next fast acquire puts it back).
local KEEP = '~'

-- The earliest lease: its deadline and token (nil when there is none).
local function earliest(k)
  local f = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  if f[2] then return tonumber(f[2]), f[1] end
  return nil, nil
end

-- Append field, value to the pending HSET's arguments (a table made on first use).
local function put(args, n, field, value)
  if not args then args = {} end
  args[n + 1], args[n + 2] = field, value
  return args, n + 2
end

local function not_a_number(key, field)
  return schema_error(key, 'field ' .. field .. ' is not a number')
end

-- Adaptive limit ----------------------------------------------------------------------
-- Parameters from ARGV[7]: min, max, initial, backoff, tolerance, smoothing; nil when
-- the string is empty, false when it is malformed.
-- parse(s), remembered per distinct string (at most 64: a function library keeps them
-- across calls, and workers send the same few)
local function memoized(parse)
  local memo, n = {}, 0
  return function(s)
    if s == nil then s = false end  -- (nil cannot be a key; a missing field is false)
    local v = memo[s]
    if v == nil then
      v = parse(s)
      if n >= 64 then memo, n = {}, 0 end
      memo[s], n = v, n + 1
    end
    return v
  end
end

-- "min,max,initial,backoff,tolerance,smoothing[,target_ms,probe_ms,window_ms]"; the
-- last three default to none, 10000 and 200 (strings of six fields stay valid).
local function parse_params(s)
  local a, b, c, d, e, f, rest = string.match(s, '^(%d+),(%d+),(%d+),(%d+),(%d+),(%d+)(.*)$')
  a, b, c = tonumber(a), tonumber(b), tonumber(c)
  if not a or a < 1 or b < a or c < a or c > b then return false end
  local target, probe, window = 0, 10000, 200
  if rest ~= '' then
    target, probe, window = string.match(rest, '^,(%d+),(%d+),(%d+)$')
    target, probe, window = tonumber(target), tonumber(probe), tonumber(window)
    if not target or probe < 1 or window < 1 then return false end
  end
  return {min = a, max = b, initial = c, backoff = tonumber(d) / 1000000,
          tolerance = tonumber(e) / 1000000, smoothing = tonumber(f) / 1000000,
          target = target, probe = probe, window = window}
end

local parsed_params = memoized(parse_params)
local function adaptive_params(s)
  if not s or s == '' then return nil end
  return parsed_params(s)
end

-- The adaptive state in meta: the limit, the last window's mean latency (a_rtt_s) and
-- the no-load reference (a_rtt_l, 0: not measured yet), the server ms of the last
-- decrease and until which increases are paused, why it last moved and when, the
-- open window (start ms, successes, their latency sum), when the next probe of the
-- reference is due, the limit a probe restores (0: not probing), growth windows in a row,
-- the server ms of the last 429.
local A_FIELDS = {'a_limit', 'a_rtt_s', 'a_rtt_l', 'a_dec', 'a_pause', 'a_why', 'a_moved',
                  'a_ws', 'a_wn', 'a_wsum', 'a_probe', 'a_saved', 'a_streak', 'a_429'}
local A_NUMERIC = {'%.3f', '%.3f', '%.3f', '%d', '%d', nil, '%d', '%d', '%d', '%d', '%d',
                   '%.3f', '%d', '%d'}
local A_KEYS = {'limit', 'rtt_s', 'ref', 'dec', 'pause', 'why', 'moved', 'ws', 'wn', 'wsum',
                'probe', 'saved', 'streak', 'r429'}
local N_A = #A_FIELDS

-- The adaptive state (meta a_* fields, `raw[first..]` in A_FIELDS order) as numbers.
local function adaptive_state(raw, first, p)
  local st = {raw = {}, old = {}}
  for i = 1, N_A do
    local text = raw[first + i - 1]
    st.raw[i] = text
    local v = text
    if A_NUMERIC[i] then v = tonumber(text) end
    st.old[i] = v
    st[A_KEYS[i]] = v or (A_NUMERIC[i] and 0 or '')
  end
  if not st.old[1] then st.limit, st.why, st.fresh = p.initial, 'initial', true end
  if st.limit < p.min then st.limit = p.min end
  if st.limit > p.max then st.limit = p.max end
  return st
end

-- Windows need this many successes (and `window` ms) before they close, or a third
-- of them and three windows' time (little traffic).
local MIN_SAMPLES = 24

-- Whether a window (opened at `ws`, `wn` successes of mean `rtt`) closes now: it is
-- full, or its mean is already above the tolerated latency or the target.
-- A probe's window (`probing`) needs twice as many: its mean becomes the reference.
local function window_closes(p, ws, wn, rtt, ref, now, probing)
  local need = probing and 2 * MIN_SAMPLES or MIN_SAMPLES
  if wn < need / 3 then return false end
  local age = now - ws
  if wn < need then return age >= 3 * p.window end
  return age >= p.window or (ref > 0 and (rtt > ref * p.tolerance
                                          or (p.target > 0 and rtt > p.target)))
end

-- A window closes: its mean latency `rtt` moves the limit (docs/ADAPTIVE.md has the
-- why). The reference is the mean latency at a limit the dependency cannot queue
-- behind: the first window's, averaged with the next ones below 1.05 x it while the
-- limit first grows (slow start, x1.3 per window), then re-measured every `probe` ms
-- at half the limit. Above the target, or `tolerance` x the reference (two windows in
-- a row, or twice that far), the limit is cut to what holds no queue
-- (limit x reference / rtt, at least half). Otherwise the queue the latency shows
-- (Little) is held at a headroom: trimmed above it, grown below it (faster window
-- after window). After a 429 the 429s mark the capacity, not latency below tolerance.
local function close_window(st, p, rtt, in_use, now)
  local previous = st.rtt_s
  st.rtt_s = rtt
  local starting = st.dec <= 0               -- slow start: nothing cut the limit yet
  local measured = st.saved > 0
  if measured then                          -- a probe ends: the reference re-measured
    -- (rising by at most `tolerance` per probe: one stalled window is not the norm)
    -- (averaged with the last one, which halves a single window's noise)
    st.ref = (st.ref + math.min(rtt, st.ref * p.tolerance)) / 2
    st.limit, st.saved = st.saved, 0
    st.probe, st.why = now + p.probe, 'no-load latency re-measured'
  elseif st.ref <= 0 then
    st.ref, st.probe, st.why = rtt, now + p.probe, 'no-load latency measured'
  elseif starting and rtt < st.ref * 1.1 then  -- no queue yet in slow start: averaged in
    st.ref = (st.ref + rtt) / 2
  elseif now >= st.probe and st.probe > 0 then  -- a probe starts: half the limit
    st.saved = st.limit
    st.limit = math.max(p.min, st.limit * 0.75)
    st.why = 'measuring no-load latency'
  end
  -- after a cut or at a probe the next window opens once the calls of the old limit
  -- had time to leave the dependency's queue (reports before then count nowhere)
  local settle = math.floor(math.min(rtt, 4 * st.ref))
  if st.saved > 0 or measured then
    st.ws, st.wn, st.wsum = now + (st.saved > 0 and settle or 0), 0, 0
    return
  end
  local target = p.target > 0 and p.target
  -- the queue the latency shows (Little: limit x (1 - reference / latency))
  local queued = st.limit * (1 - st.ref / rtt)
  local headroom = math.max(1, 0.05 * st.limit)
  -- the queue held on a dependency that queues: half a call (a few % of a large limit)
  local hold = math.max(0.5, 0.03 * st.limit)
  local growing = now >= st.pause and in_use * 4 >= math.floor(st.limit) * 3
  local refusing = st.r429 > 0 and now - st.r429 < 3 * p.probe   -- it answered 429 lately
  -- the first window after a cut: its calls may still have waited behind the queue of
  -- the old limit, so it confirms nothing and only a latency twice as far cuts again
  local after_cut = st.streak < 0
  if after_cut then st.streak = 0 end
  if target and rtt > target and (not after_cut or rtt > 2 * target) then
    st.limit = st.limit * math.max(0.5, target / rtt)
    st.why, st.dec, st.streak = 'latency above the target', now, -1
  elseif rtt > st.ref * p.tolerance and ((previous > st.ref * p.tolerance and not after_cut)
                                         or rtt > 2 * st.ref * p.tolerance) then
    -- (two windows in a row, or one twice as far: one noisy window is only trimmed)
    st.limit = st.limit * math.max(0.5, st.ref / rtt)
    st.why, st.dec, st.streak = 'latency far above the no-load level', now, -1
  elseif after_cut then                      -- (nothing: the window after a cut settles)
  elseif starting then                       -- slow start: x1.3 per window
    if growing then
      st.limit, st.why = st.limit * 1.3, 'slow start'
    end
  elseif queued > hold and not refusing then
    -- a dependency that queues (it answered no 429 lately): the queue is held at
    -- `hold`; a window above it takes part of the excess off
    st.limit = st.limit - math.min(p.smoothing * (queued - hold), 0.25 * st.limit)
    st.why, st.dec, st.streak = 'latency above the no-load level', now, 0
  elseif growing then                        -- one below adds, faster window after window
    st.streak = math.min(st.streak + 1, 8)
    local room = headroom
    if not refusing then room = math.max(hold - math.max(0, queued), 0.2 * hold) end
    st.limit = st.limit + p.smoothing * room * (1 + st.streak / 2)
    if st.streak >= 3 and queued <= 0 then   -- no queue window after window: capacity
      st.limit = st.limit * (1 + 0.05 * (st.streak - 2))   -- came back, find it sooner
    end
    st.why = 'latency at the no-load level: growing'
  end
  if starting and st.dec == now then
    -- slow start ended: its windows, averaged into the reference, may have held a queue
    -- at the end; a probe soon (five windows) measures it clean
    st.probe = math.min(st.probe, now + 5 * p.window)
  end
  st.ws, st.wn, st.wsum = now + (st.dec == now and settle or 0), 0, 0
end

-- One reported outcome: a failure, timeout or 429 multiplies the limit by `backoff`,
-- at most once per window or last mean latency (a burst is one signal), and restarts
-- the window; a 429's Retry-After also pauses increases. Successes (`weight` of them,
-- of mean latency `latency`) add to the open window, which closes once it holds
-- MIN_SAMPLES successes and has lasted `window` ms, or sooner when its mean is already
-- above 1.5 x the tolerated latency (or the target): a queue building fast is cut fast.
local function adapt(st, p, outcome, latency, retry_after, in_use, now, weight)
  local before = st.limit
  if outcome == 'drop' or outcome == '429' then
    if now - st.dec >= math.max(p.window, st.rtt_s) then
      st.limit, st.dec, st.streak = math.max(p.min, st.limit * p.backoff), now, 0
      st.why = outcome == '429' and 'overload (429)' or 'failure or timeout'
      st.ws, st.wn, st.wsum = now, 0, 0
    end
    if outcome == '429' then st.r429 = now end
    if outcome == '429' and retry_after > 0 and now + retry_after > st.pause then
      st.pause = now + retry_after
      st.why = 'overload (429): increases paused'
    end
  elseif outcome == 'ok' and now >= st.ws then
    if st.ws <= 0 then st.ws = now end   -- the first report opens the first window
    st.wn, st.wsum = st.wn + weight, st.wsum + latency * weight
    if st.wn > 0 and window_closes(p, st.ws, st.wn, st.wsum / st.wn, st.ref, now,
                                   st.saved > 0) then
      close_window(st, p, st.wsum / st.wn, in_use, now)
    end
  end
  if st.limit < p.min then st.limit = p.min end
  if st.limit > p.max then st.limit = p.max end
  if math.floor(st.limit) ~= math.floor(before) then st.moved = now end
end

local function adaptive_writes(st)
  local out, raw, old = {}, st.raw, st.old
  for i = 1, N_A do
    local value, fmt = st[A_KEYS[i]], A_NUMERIC[i]
    if fmt then
      if old[i] ~= value then
        local text = string.format(fmt, value)
        if raw[i] ~= text then out[#out + 1] = A_FIELDS[i]; out[#out + 1] = text end
      end
    elseif raw[i] ~= value then
      out[#out + 1] = A_FIELDS[i]; out[#out + 1] = value
    end
  end
  return out
end

-- The hot paths ----------------------------------------------------------------------
-- A granted acquire, a release of a live lease, and an adaptive outcome report, while
-- no waiter is registered: the general path's result with fewer commands and
-- conversions. Each answers nil, having written nothing, whenever the case is not that
-- simple (a waiter, a full bulkhead, a fresh adaptive limit, a lost lease, anything odd
-- in meta); the general path then runs and decides, and names foreign data.

-- An a_limit text as {the number, its integer part as text}, false when it is not a
-- number (it changes only with a sampled report, so most calls find it remembered).
local a_limit_of = memoized(function(raw)
  local a = tonumber(raw)
  return a and {a, string.format('%d', math.floor(a))} or false
end)

-- Texts parsed once while they stay the same (tonumber of a string costs about as much
-- as a command's argument handling): the TIME reply's seconds (they change once a
-- second) and meta's ttl_until (it changes once per refresh). Fast paths only.
local tonumber_, type_, sformat_, rcall_, rpcall_ = tonumber, type, string.format, redis.call,
                                                 redis.pcall
local last_s, last_s_ms, last_until_s, last_until = nil, 0, nil, nil
local function server_ms(t)
  local s = t[1]
  if s ~= last_s then last_s, last_s_ms = s, tonumber_(s) * 1000 end
  local micros = tonumber_(t[2])
  return last_s_ms + (micros - micros % 1000) / 1000
end
local function until_of(text)  -- ttl_until (false: absent, 0) as a number; nil: not one
  if not text then return 0 end
  if text ~= last_until_s then last_until_s, last_until = text, tonumber_(text) end
  return last_until
end

-- Whether the token holds a live lease (deadline after now): an expired one, even if no
-- op reaped it yet, is lost as the general path says (it reaps first).
local function live_lease(k_leases, token, now)
  local held = rpcall_('ZSCORE', k_leases, token)
  return type_(held) == 'string' and tonumber_(held) > now
end

-- Whether an op that writes meta (or adds a lease for `keep_for` ms) refreshes the TTLs:
-- no ttl_until stored, or it ends before keep_for, or less than half of key_ttl is left.
local function refresh_due(until_ms, now, keep_for, ttl_ms)
  return not until_ms or until_ms <= 0 or until_ms - now < keep_for
      or (until_ms - now) * 2 < ttl_ms
end

-- The stored adaptive limit within the caller's bounds, and its text (nil: none stored).
local function stored_limit_of(raw, p)
  local e = a_limit_of(raw)
  if not e then return nil end
  local a = e[1]
  if a >= p.min and a <= p.max then return math.floor(a), e[2] end
  if a < p.min then a = p.min end
  if a > p.max then a = p.max end
  return math.floor(a), string.format('%d', math.floor(a))
end

local function fast_acquire(k_leases, k_meta, token, limit, limit_s, lease_ms, ttl_ms, ttl_s,
                            share, ap, now)
  local m
  if ap then
    m = redis.pcall('HMGET', k_meta, 'waiters', 'ttl_until', 'limit', 'a_limit')
  else
    m = rpcall_('HMGET', k_meta, 'waiters', 'ttl_until', 'limit')
  end
  if m['err'] or (m[1] and m[1] ~= '0') then return nil end
  if ap then  -- else limit_s as sent (the general path too)
    limit, limit_s = stored_limit_of(m[4], ap)
    if not limit then return nil end
  end
  local until_ms = until_of(m[2])
  if not until_ms or (m[3] and m[3] ~= limit_s and not tonumber(m[3])) then return nil end
  -- the live leases (deadline after now); expired ones are reaped below only when the
  -- TTLs are refreshed (they count for nothing meanwhile), and by the general path
  local in_use = rpcall_('ZCOUNT', k_leases, sformat_('%d', now + 1), '+inf')
  if type_(in_use) ~= 'number' then return nil end
  local cap = limit
  if share < 1 then cap = math.max(1, math.floor(limit * share)) end
  local deadline = sformat_('%d', now + lease_ms)
  local created = false  -- this ZADD may have created the zset (it then needs its TTL)
  if in_use >= cap then  -- full: only a token holding a live lease gets in (refreshed)
    if not live_lease(k_leases, token, now) then return nil end
    redis.call('ZADD', k_leases, deadline, token)
  elseif in_use == 0 then
    -- no live lease: the token, if there, has expired (a new permit either way). The
    -- keep-alive member KEEP (score 0: never live) stays when the last lease is
    -- released, so the zset outlives sequential acquire/release pairs and its TTL is
    -- set only when this ZADD added KEEP too (2 added: the zset may be new).
    if type_(rpcall_('HINCRBY', k_meta, 'acquired', '1')) ~= 'number' then return nil end
    created = rcall_('ZADD', k_leases, deadline, token, '0', KEEP) == 2
    in_use = 1
  else
    -- counted first: a foreign (non-integer) counter stops the call before any write
    if type(redis.pcall('HINCRBY', k_meta, 'acquired', '1')) ~= 'number' then return nil end
    if redis.call('ZADD', k_leases, 'NX', deadline, token) == 1 then
      in_use = in_use + 1
    else  -- the token was there: a live lease is refreshed (not a new permit)
      local held = tonumber(redis.call('ZSCORE', k_leases, token))
      redis.call('ZADD', k_leases, deadline, token)
      if held > now then redis.call('HINCRBY', k_meta, 'acquired', -1) else in_use = in_use + 1 end
    end
  end
  local refresh = refresh_due(until_ms, now, lease_ms, ttl_ms)
  if refresh then  -- the expired leases, KEEP kept (score 0)
    redis.call('ZREMRANGEBYSCORE', k_leases, '(0', string.format('%d', now))
  end
  if refresh and m[3] ~= limit_s then
    redis.call('HSET', k_meta, 'ttl_until', string.format('%d', now + ttl_ms), 'limit', limit_s)
  elseif refresh then
    redis.call('HSET', k_meta, 'ttl_until', string.format('%d', now + ttl_ms))
  elseif m[3] ~= limit_s then
    redis.call('HSET', k_meta, 'limit', limit_s)
  end
  if refresh then
    redis.call('PEXPIRE', k_meta, ttl_s)
    redis.call('PEXPIRE', k_leases, ttl_s)
  elseif created then  -- this ZADD created the zset (or put KEEP back): it expires with meta
    redis.call('PEXPIREAT', k_leases, m[2])
  end
  return 1
end

local function fast_release(k_leases, k_meta, token, now, ap)
  local w
  if ap then  -- no adaptive limit stored yet (or not a number): the general path stores it
    local m = redis.pcall('HMGET', k_meta, 'waiters', 'a_limit')
    if m['err'] or not a_limit_of(m[2]) then return nil end
    w = m[1]
  else
    w = rpcall_('HGET', k_meta, 'waiters')
    if type_(w) == 'table' then return nil end
  end
  if (w and w ~= '0') or not live_lease(k_leases, token, now) then return nil end
  rcall_('ZREM', k_leases, token)
  return 1
end

-- A release that reports its outcome to an adaptive limit while no waiter is
-- registered: the general path's lease removal, adapt() and writes, without its reads
-- of the counters and the earliest lease. `in_use` for adapt() counts the live leases
-- before this release (this one included), as the general path does.
-- The usual success report: it adds to the open window without closing it. Only the
-- window's fields are read and written; nil (nothing written) when the window closes
-- or anything is unusual, and the full report below runs.
local function window_add(k_leases, k_meta, token, ap, argv, now, ttl_ms, ttl_s)
  local m = redis.pcall('HMGET', k_meta, 'waiters', 'ttl_until', 'a_limit', 'a_ws', 'a_wn',
                        'a_wsum', 'a_rtt_l', 'a_saved')
  if m['err'] or (m[1] and m[1] ~= '0') or not tonumber(m[3]) then return nil end
  local until_ms, ws, wn = tonumber(m[2] or 0), tonumber(m[4] or 0), tonumber(m[5] or 0)
  local wsum, ref, saved = tonumber(m[6] or 0), tonumber(m[7] or 0), tonumber(m[8] or 0)
  if not (until_ms and ws and wn and wsum and ref and saved) then return nil end
  local latency, weight = tonumber(argv[9]) or 0, math.max(1, tonumber(argv[11]) or 1)
  if ws <= 0 then return nil end   -- the first window: adapt() opens it
  local counted = now >= ws
  if counted then
    wn, wsum = wn + weight, wsum + latency * weight
    if window_closes(ap, ws, wn, wsum / wn, ref, now, saved > 0) then
      return nil   -- adapt() closes it
    end
  end
  if not live_lease(k_leases, token, now) then return nil end
  redis.call('ZREM', k_leases, token)
  local refresh = refresh_due(until_ms, now, 0, ttl_ms)
  local wn_s, wsum_s = string.format('%d', wn), string.format('%d', wsum)
  if counted and refresh then
    redis.call('HSET', k_meta, 'a_wn', wn_s, 'a_wsum', wsum_s, 'ttl_until',
               string.format('%d', now + ttl_ms))
  elseif counted then
    redis.call('HSET', k_meta, 'a_wn', wn_s, 'a_wsum', wsum_s)
  elseif refresh then
    redis.call('HSET', k_meta, 'ttl_until', string.format('%d', now + ttl_ms))
  end
  if refresh then
    redis.call('PEXPIRE', k_meta, ttl_s)
    redis.call('PEXPIRE', k_leases, ttl_s)
  end
  return 1
end

local function fast_report(k_leases, k_meta, token, ap, argv, now, ttl_ms, ttl_s)
  local m = redis.pcall('HMGET', k_meta, 'waiters', 'ttl_until', 'limit', unpack(A_FIELDS))
  if m['err'] or (m[1] and m[1] ~= '0') or not tonumber(m[4]) then return nil end
  local until_ms, stored_limit = tonumber(m[2] or 0), tonumber(m[3] or 0)
  if not until_ms or not stored_limit then return nil end
  if not live_lease(k_leases, token, now) then return nil end
  local in_use = redis.call('ZCOUNT', k_leases, string.format('%d', now + 1), '+inf')
  redis.call('ZREM', k_leases, token)
  local st = adaptive_state(m, 4, ap)
  adapt(st, ap, argv[8], tonumber(argv[9]) or 0, tonumber(argv[10]) or 0, in_use, now,
        math.max(1, tonumber(argv[11]) or 1))
  local w = adaptive_writes(st)
  local limit = math.floor(st.limit)
  if stored_limit ~= limit then w[#w + 1] = 'limit'; w[#w + 1] = string.format('%d', limit) end
  local refresh = refresh_due(until_ms, now, 0, ttl_ms)
  if refresh then w[#w + 1] = 'ttl_until'; w[#w + 1] = string.format('%d', now + ttl_ms) end
  if #w > 0 then redis.call('HSET', k_meta, unpack(w)) end
  if refresh then
    redis.call('PEXPIRE', k_meta, ttl_s)
    if in_use > 1 then redis.call('PEXPIRE', k_leases, ttl_s) end
  end
  return 1
end

-- ARGV[3..5] as numbers {limit, lease ms, ttl ms}, false when malformed; parsed once
-- per distinct string (a function library keeps them: workers send the same few).
-- (Looked up by the three strings in turn: cheaper than a key made by concatenation.)
local LIMITS, LIMITS_N = {}, 0
local function parse_limits(a3, a4, a5)
  local by3 = LIMITS[a3 or '']
  local by4 = by3 and by3[a4 or '']
  local parsed = by4 and by4[a5 or '']
  if parsed == nil then
    local limit, lease_ms, ttl_ms = tonumber(a3), tonumber(a4), tonumber(a5)
    parsed = false
    if limit and limit >= 1 and lease_ms and lease_ms >= 1 and ttl_ms and ttl_ms >= 1 then
      parsed = {limit, lease_ms, ttl_ms}
    end
    if LIMITS_N >= 64 then LIMITS, LIMITS_N, by3, by4 = {}, 0, nil, nil end
    if not by3 then by3 = {}; LIMITS[a3 or ''] = by3 end
    if not by4 then by4 = {}; by3[a4 or ''] = by4 end
    by4[a5 or ''], LIMITS_N = parsed, LIMITS_N + 1
  end
  return parsed
end

-- The general path, in named steps over one per-call table `c` (the hot paths above
-- answer the usual calls without it). Each step that can refuse answers an error
-- reply, or nil.

-- The call's arguments and server time, as locals (the hot paths take them so, no
-- table): op, token, limit, limit_s, lease_ms, ttl_ms, ttl_s, wait_ms, now, adaptive
-- params, priority share; or nil and an error reply when they are bad.
local function parse_call(ARGV, given_now)
  local op, token, limit_s, ttl_s = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
  local limits = parse_limits(limit_s, ARGV[4], ttl_s)
  local wait_ms = 0
  if ARGV[6] and ARGV[6] ~= '0' then wait_ms = tonumber(ARGV[6]) end
  if not limits or not wait_ms or wait_ms < 0 then
    return nil, bad_args('bad bulkhead arguments')
  end
  if not OPS[op] then return nil, bad_args('unknown bulkhead op ' .. tostring(op)) end
  if op == 'acquire' and token == '' then return nil, bad_args('acquire needs a token') end
  local now = given_now  -- a merged call (lua/finish.lua) read TIME once for all its calls
  if not now then now = server_ms(redis.call('TIME')) end
  local ap = adaptive_params(ARGV[7])
  if ap == false then return nil, bad_args('bad adaptive limit ' .. tostring(ARGV[7])) end
  local share = 1
  if op == 'acquire' and ARGV[8] and ARGV[8] ~= '' then
    share = tonumber(ARGV[8])
    if not share or share <= 0 or share > 1000000 then
      return nil, bad_args('priority share must be in (0, 1000000]')
    end
    share = share / 1000000
  end
  return op, token, limits[1], limit_s, limits[2], limits[3], ttl_s, wait_ms, now, ap, share
end

-- Reads, before any write: the meta counters (and an adaptive bulkhead's state, whose
-- limit is the stored one: its initial value at first).
local function read_meta(c)
  local m
  if c.ap and not c.reports then
    m = redis.pcall('HMGET', c.K_META, 'rejected', 'acquired', 'lost', 'limit', 'waiters',
                    'ttl_until', 'a_limit')
  elseif c.ap then
    m = redis.pcall('HMGET', c.K_META, 'rejected', 'acquired', 'lost', 'limit', 'waiters',
                    'ttl_until', unpack(A_FIELDS))
  else
    m = redis.pcall('HMGET', c.K_META, 'rejected', 'acquired', 'lost', 'limit', 'waiters',
                    'ttl_until')
  end
  if m['err'] then return failed_on(c.K_META, 'hash', m) end
  for i = 1, 6 do
    if m[i] then
      local v = tonumber(m[i])
      if not v then return not_a_number(c.K_META, COUNTERS[i]) end
      m[i] = v
    else
      m[i] = 0
    end
  end
  c.rejected, c.acquired, c.lost, c.stored_limit, c.stored_waiters = m[1], m[2], m[3], m[4],
                                                                      m[5]
  if m[6] > 0 then c.until_ms = m[6] end
  if c.ap then
    c.ast = adaptive_state(m, 7, c.ap)
    c.limit, c.limit_s = math.floor(c.ast.limit), string.format('%d', math.floor(c.ast.limit))
  end
  c.adapted = c.ast ~= nil and c.ast.fresh == true  -- a new limit is stored once
  return nil
end

-- Waiters (w:<token> fields), read only when the hash counts some: the live ones,
-- the expired ones, and the wake-ups already owed (the notify list's length).
local function read_waiters(c)
  c.waiting, c.have = 0, 0
  if c.stored_waiters <= 0 then return nil end
  local waiters, expired = {}, {}
  local all = redis.call('HGETALL', c.K_META)
  for i = 1, #all, 2 do
    local field = all[i]
    local waiter = string.sub(field, 1, 2) == 'w:'
    local value = 0  -- only waiter deadlines are read here (a_why is text)
    if waiter then value = tonumber(all[i + 1]) end
    if value == nil then return not_a_number(c.K_META, field) end
    if waiter then
      if value <= c.now then
        expired[#expired + 1] = field
      else
        waiters[field] = value
        c.waiting = c.waiting + 1
      end
    end
  end
  c.waiters, c.expired = waiters, expired
  local have = redis.pcall('LLEN', c.K_NOTIFY)
  if type(have) == 'table' then return failed_on(c.K_NOTIFY, 'list', have) end
  c.have = have
  return nil
end

-- The earliest lease (the last read), then the first writes: expired leases and
-- waiters reaped.
local function read_leases_and_reap(c)
  local f = redis.pcall('ZRANGE', c.K_LEASES, 0, 0, 'WITHSCORES')
  if f['err'] then return failed_on(c.K_LEASES, 'zset', f) end
  if f[2] then c.first, c.first_tok = f[2] + 0, f[1] end
  if c.first and c.first <= c.now then
    redis.call('ZREMRANGEBYSCORE', c.K_LEASES, '-inf', c.now)
    c.first, c.first_tok = earliest(c.K_LEASES)
  end
  c.existed = c.first ~= nil      -- the leases zset exists (it is never empty)
  c.in_use = 0
  if c.existed then c.in_use = redis.call('ZCARD', c.K_LEASES) end
  c.meta_written, c.wrote = false, false
  if c.expired and #c.expired > 0 then
    redis.call('HDEL', c.K_META, unpack(c.expired))
    c.meta_written, c.wrote = true, true
  end
  return nil
end

-- A lease's deadline moved to `deadline`: keep track of the earliest one.
local function lease_moved(c, deadline)
  if c.token == c.first_tok then
    c.reread = true
  elseif not c.first or deadline < c.first then
    c.first, c.first_tok = deadline, c.token
  end
end

-- The ops. Each sets c.ok (0: refused or lost), the one counter it changes (c.counter,
-- c.count), and what to write (c.wrote, c.leased, c.drop the waiter, c.keep_for).
local OP = {}

function OP.acquire(c)
  -- ZSCORE only when full: a free permit is granted (or the lease refreshed) by ZADD.
  -- a priority below critical may use floor(limit * share) permits, at least one
  local cap = c.limit
  if c.share < 1 then cap = math.max(1, math.floor(c.limit * c.share)) end
  if c.in_use < cap or redis.call('ZSCORE', c.K_LEASES, c.token) then
    local deadline = c.now + c.lease_ms
    if redis.call('ZADD', c.K_LEASES, string.format('%d', deadline), c.token) == 1 then
      c.in_use = c.in_use + 1
      c.acquired = c.acquired + 1
      c.counter, c.count = 'acquired', c.acquired
    end
    lease_moved(c, deadline)
    c.wrote, c.leased, c.drop, c.keep_for = true, true, true, c.lease_ms
  else
    c.ok = 0
    if c.wait_ms > 0 then
      local w = 'w:' .. c.token
      if not (c.waiters and c.waiters[w]) then c.waiting = c.waiting + 1 end
      redis.call('HSET', c.K_META, w, string.format('%d', c.now + c.wait_ms))
      c.wrote, c.meta_written, c.keep_for = true, true, c.wait_ms
    else
      c.drop = true
      c.rejected = c.rejected + 1
      c.counter, c.count = 'rejected', c.rejected
    end
  end
end

function OP.release(c)
  if redis.call('ZREM', c.K_LEASES, c.token) == 1 then
    c.in_use = c.in_use - 1
    c.reread = c.token == c.first_tok
    c.wrote = true
    local argv, outcome = c.argv, c.argv[8] or ''
    if c.ast and outcome ~= '' then
      adapt(c.ast, c.ap, outcome, tonumber(argv[9]) or 0, tonumber(argv[10]) or 0,
            c.in_use + 1, c.now, math.max(1, tonumber(argv[11]) or 1))
      c.adapted, c.meta_written = true, true
      c.limit, c.limit_s = math.floor(c.ast.limit), string.format('%d', math.floor(c.ast.limit))
    end
  else
    c.ok = 0
    c.lost = c.lost + 1
    c.counter, c.count = 'lost', c.lost
  end
end

function OP.renew(c)
  if redis.call('ZSCORE', c.K_LEASES, c.token) then
    local deadline = c.now + c.lease_ms
    redis.call('ZADD', c.K_LEASES, 'XX', string.format('%d', deadline), c.token)
    lease_moved(c, deadline)
    c.wrote, c.leased, c.keep_for = true, true, c.lease_ms
  else
    c.ok = 0
    c.lost = c.lost + 1
    c.counter, c.count = 'lost', c.lost
  end
end

function OP.restart(c)
  local ast, ap = c.ast, c.ap
  if ast then
    ast.limit, ast.why, ast.moved, ast.pause = ap.min, 'restart after a recovery', c.now, 0
    ast.saved, ast.streak, ast.ws, ast.wn, ast.wsum = 0, 0, c.now, 0, 0
    c.limit, c.limit_s = ap.min, string.format('%d', ap.min)
    c.adapted, c.wrote, c.meta_written = true, true, true
  end
end

function OP.cancel(c)
  if redis.call('ZREM', c.K_LEASES, c.token) == 1 then
    c.in_use = c.in_use - 1
    c.reread = c.token == c.first_tok
  end
  c.drop, c.wrote = true, true
end

function OP.metrics() end

-- One HSET of what changed: the counter, the limit (from a writing caller), the
-- waiter count, ttl_until when the TTLs are refreshed, the adaptive state. Sets
-- c.refresh.
local function write_meta(c)
  if c.drop and c.waiters and c.waiters['w:' .. c.token] then
    redis.call('HDEL', c.K_META, 'w:' .. c.token)
    c.waiting = c.waiting - 1
    c.meta_written = true
  end
  if c.counter then c.wrote, c.meta_written = true, true end
  -- storing the limit writes meta too (and may create it: it must get its TTL)
  local limit_written = c.wrote and c.stored_limit ~= c.limit
  if limit_written then c.meta_written = true end
  c.refresh = false
  if c.meta_written or c.leased then
    c.refresh = refresh_due(c.until_ms, c.now, c.keep_for, c.ttl_ms)
  end
  local args, n = nil, 0
  if c.counter then args, n = put(args, n, c.counter, string.format('%d', c.count)) end
  if limit_written then args, n = put(args, n, 'limit', c.limit_s) end
  if c.waiting ~= c.stored_waiters then
    args, n = put(args, n, 'waiters', string.format('%d', c.waiting))
  end
  if c.refresh then
    args, n = put(args, n, 'ttl_until', string.format('%d', c.now + c.ttl_ms))
  end
  if c.adapted then
    local a = adaptive_writes(c.ast)
    for i = 1, #a, 2 do args, n = put(args, n, a[i], a[i + 1]) end
  end
  if n == 2 then
    redis.call('HSET', c.K_META, args[1], args[2])
  elseif n > 0 then
    redis.call('HSET', c.K_META, unpack(args, 1, n))
  end
end

-- Owe exactly min(free, waiting) wake-ups.
local function owe_wakeups(c)
  local free = c.limit - c.in_use
  if free < 0 then free = 0 end
  local want, have = c.waiting, c.have
  if free < want then want = free end
  if have < want then
    for _ = have + 1, want do redis.call('LPUSH', c.K_NOTIFY, '1') end
    redis.call('PEXPIRE', c.K_NOTIFY, c.ttl_s)
  elseif have > want then
    if want == 0 then
      redis.call('DEL', c.K_NOTIFY)
    else
      redis.call('LTRIM', c.K_NOTIFY, 0, want - 1)
    end
  end
end

-- TTLs: both keys expire at ttl_until, which outlives every lease and waiter deadline.
local function refresh_ttls(c)
  if c.refresh then
    redis.call('PEXPIRE', c.K_META, c.ttl_s)
    if c.in_use > 0 then redis.call('PEXPIRE', c.K_LEASES, c.ttl_s) end
  elseif c.leased and not c.existed then
    redis.call('PEXPIREAT', c.K_LEASES, string.format('%d', c.until_ms))
  end
end

local function reply(c)
  local next_in = 0
  if c.in_use > 0 then
    local first = c.first
    if c.reread then first = earliest(c.K_LEASES) end
    if first then
      next_in = first - c.now
      if next_in < 1 then next_in = 1 end
    end
  end
  return {c.ok, c.in_use, c.limit, c.waiting, c.rejected, next_in, c.now, c.lost, c.acquired}
end

return function(KEYS, ARGV, given_now)
  local op, token, limit, limit_s, lease_ms, ttl_ms, ttl_s, wait_ms, now, ap, share =
    parse_call(ARGV, given_now)
  if not op then return token end  -- the error reply
  local K_LEASES, K_META = KEYS[1], KEYS[2]
  -- the hot paths: the usual acquire, release and adaptive report
  local reports = op == 'restart' or (op == 'release' and (ARGV[8] or '') ~= '')
  local fast = nil
  if op == 'acquire' then
    fast = fast_acquire(K_LEASES, K_META, token, limit, limit_s, lease_ms, ttl_ms, ttl_s, share,
                        ap, now)
  elseif op == 'release' and not reports then
    fast = fast_release(K_LEASES, K_META, token, now, ap)
  elseif op == 'release' and ap then
    if ARGV[8] == 'ok' then
      fast = window_add(K_LEASES, K_META, token, ap, ARGV, now, ttl_ms, ttl_s)
    end
    if not fast then
      fast = fast_report(K_LEASES, K_META, token, ap, ARGV, now, ttl_ms, ttl_s)
    end
  end
  if fast then return fast end
  -- the general path; KEYS[3] may be left out: the leases key plus ':notify' (only
  -- waiters use it)
  local c = {K_LEASES = K_LEASES, K_META = K_META, K_NOTIFY = KEYS[3] or (K_LEASES .. ':notify'),
             argv = ARGV, op = op, token = token, limit = limit, limit_s = limit_s,
             lease_ms = lease_ms, ttl_ms = ttl_ms, ttl_s = ttl_s, wait_ms = wait_ms, now = now,
             ap = ap, share = share, reports = reports,
             ok = 1, leased = false, reread = false, keep_for = 0, count = 0, drop = false}
  local err = read_meta(c) or read_waiters(c) or read_leases_and_reap(c)
  if err then return err end
  OP[op](c)
  write_meta(c)
  owe_wakeups(c)
  refresh_ttls(c)
  return reply(c)
end
