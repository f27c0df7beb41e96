"""Machinery every component shares: keys, scripts, connections, Redis health, the
local fallback, fork safety, listeners and the transitions subscriber. Private."""
