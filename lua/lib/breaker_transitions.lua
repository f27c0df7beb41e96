--!lib
-- The breaker's state machine in one table (as h11 keeps its own): for each state,
-- the events that move it and where to. lua/breaker.lua detects the events (server
-- time, the window's rates, the probes' verdict, an operator's `set`) and applies
-- them with `fire`; no transition is written anywhere else.
--
-- A target is a state name, or one of:
--   AFTER_HALF_OPEN  the config's state after max wait in half-open (OPEN or CLOSED)
--   RESUME           no transition: a held CLOSED resumes its state machine
--   RESTART          no transition: OPEN's wait restarts (history kind 'restart')
--   CLEAR            no transition: the window and probes are cleared, a held CLOSED
--                    released (RESET of a CLOSED breaker)
--   IGNORE           no transition and nothing written
-- A held CLOSED (an override with an end) ignores `rates_exceeded` until it ends.
-- An event a state does not list cannot happen in it. An operator's `set` of a
-- target state is the event `force` (any state -> that state, or an override
-- update when already there), not in this table.
local AFTER_HALF_OPEN, RESUME, RESTART, CLEAR, IGNORE = {}, {}, {}, {}, {}

local NEXT = {
  CLOSED = {rates_exceeded = 'OPEN', override_ended = RESUME, reset = CLEAR, trip = 'OPEN'},
  OPEN = {wait_elapsed = 'HALF_OPEN', reset = 'CLOSED', trip = RESTART},
  HALF_OPEN = {max_wait_elapsed = AFTER_HALF_OPEN, probes_failed = 'OPEN',
               probes_succeeded = 'CLOSED', reset = 'CLOSED', trip = 'OPEN'},
  FORCED_OPEN = {override_ended = 'HALF_OPEN', reset = 'CLOSED', trip = IGNORE},
  DISABLED = {override_ended = 'CLOSED', reset = 'CLOSED', trip = IGNORE},
  METRICS_ONLY = {rates_exceeded = IGNORE, override_ended = 'CLOSED', reset = 'CLOSED',
                  trip = 'OPEN'},
}

-- The reason recorded for a time-driven event (the others carry their own).
local REASON = {
  wait_elapsed = 'wait in open state elapsed',
  max_wait_elapsed = 'max wait in half-open elapsed',
  override_ended = 'override ended',
  probes_succeeded = 'half-open probes succeeded',
}

return {NEXT = NEXT, REASON = REASON, AFTER_HALF_OPEN = AFTER_HALF_OPEN, RESUME = RESUME,
        RESTART = RESTART, CLEAR = CLEAR, IGNORE = IGNORE}
