<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * A fleet-wide bulkhead over lua/bulkhead.lua: at most max_concurrent_calls
 * calls run at once across every PHP and Python process using the same name.
 * Options and defaults are Python's BulkheadConfig: max_concurrent_calls (25),
 * max_wait_duration (0 s = fail fast), lease (30 s), key_ttl (3600 s),
 * fallback_limit (null; 0 = reject while Redis is unreachable), expected_workers
 * (accepted for config sharing), adaptive (null, an AdaptiveLimit or an array of
 * its options: the limit then lives in Redis and moves with the outcomes every
 * worker reports; max_concurrent_calls is then only the wire's fixed-limit field),
 * critical_reserve (0.1) and sheddable_share (0.7) for priorities, plus 'prefix'
 * and 'lua_dir'. See docs/ADAPTIVE.md.
 *
 * Every permit is a lease in server time: a process that dies gives its permit
 * back within one lease. PHP has no background thread to renew it, so choose a
 * lease longer than your longest call (e.g. max_execution_time) or call
 * renew() from long loops.
 */
final class Bulkhead
{
    public const SCRIPT = 'bulkhead';
    public const DEFAULTS = [
        'max_concurrent_calls' => 25,
        'max_wait_duration' => 0.0,
        'lease' => 30.0,
        'expected_workers' => 1,
        'fallback_limit' => null,
        'key_ttl' => 3600.0,
        'adaptive' => null,
        'critical_reserve' => 0.1,
        'sheddable_share' => 0.7,
    ];
    /** Named priorities, most important first (an int is accepted too: 0 is critical). */
    public const PRIORITIES = ['critical' => 0, 'normal' => 1, 'sheddable' => 2];
    private const MILLION = 1000000;
    /** A registered waiter stays counted this long after its deadline (same as Python). */
    private const WAITER_GRACE_MS = 1000;
    private const MIN_BLOCK = 0.002;
    private const DEADLINE_SLACK = 0.005;

    public readonly int $maxConcurrentCalls;
    public readonly float $maxWaitDuration;
    public readonly float $lease;
    public readonly ?int $fallbackLimit;
    public readonly float $keyTtl;
    public readonly ?AdaptiveLimit $adaptive;
    public readonly float $criticalReserve;
    public readonly float $sheddableShare;
    /** @var array{leases: string, meta: string, notify: string} */
    public readonly array $keys;
    /** @var array{source: string, sha: string} */
    private array $script;
    private int $leaseMs;
    private int $ttlMs;

    /** @param array<string, mixed> $config */
    public function __construct(private readonly \Redis|\RedisCluster|Connection $redis, public readonly string $name, array $config = [])
    {
        $prefix = $config['prefix'] ?? Keys::DEFAULT_PREFIX;
        $luaDir = $config['lua_dir'] ?? null;
        unset($config['prefix'], $config['lua_dir']);
        Options::refuseUnknown($config, 'bulkhead', self::DEFAULTS);
        $o = $config + self::DEFAULTS;
        foreach (['max_concurrent_calls' => 1, 'expected_workers' => 1] as $field => $low) {
            if (!is_int($o[$field]) || $o[$field] < $low || $o[$field] > 1000000) {
                throw new \InvalidArgumentException("{$field} must be an integer in [{$low}, 1000000], got " . var_export($o[$field], true));
            }
        }
        if ($o['fallback_limit'] !== null && (!is_int($o['fallback_limit']) || $o['fallback_limit'] < 0)) {
            throw new \InvalidArgumentException('fallback_limit must be null or an integer >= 0, got ' . var_export($o['fallback_limit'], true));
        }
        foreach (['max_wait_duration', 'lease', 'key_ttl'] as $field) {
            $v = $o[$field];
            if (!(is_int($v) || is_float($v)) || !is_finite((float) $v) || $v < 0) {
                throw new \InvalidArgumentException("{$field} must be a finite duration >= 0 seconds, got " . var_export($v, true));
            }
        }
        if ($o['lease'] < 0.01) {
            throw new \InvalidArgumentException('lease must be >= 0.01 seconds, got ' . var_export($o['lease'], true));
        }
        $floor = max((float) $o['lease'], (float) $o['max_wait_duration']);
        if ($o['key_ttl'] < $floor) {
            throw new \InvalidArgumentException("key_ttl must be >= {$floor} seconds (the lease and the longest wait), got " . var_export($o['key_ttl'], true));
        }
        $this->maxConcurrentCalls = $o['max_concurrent_calls'];
        $this->maxWaitDuration = (float) $o['max_wait_duration'];
        $this->lease = (float) $o['lease'];
        $this->fallbackLimit = $o['fallback_limit'];
        $this->keyTtl = (float) $o['key_ttl'];
        $adaptive = $o['adaptive'];
        if (is_array($adaptive)) {
            $adaptive = new AdaptiveLimit($adaptive);
        } elseif ($adaptive !== null && !$adaptive instanceof AdaptiveLimit) {
            throw new \InvalidArgumentException('adaptive must be an AdaptiveLimit, an array of its options or null, got ' . var_export($adaptive, true));
        }
        $this->adaptive = $adaptive;
        foreach (['critical_reserve', 'sheddable_share'] as $field) {
            $v = $o[$field];
            $ok = (is_int($v) || is_float($v)) && (($v >= 0 && $v < 1) || ($field === 'sheddable_share' && $v == 1));
            if (!$ok) {
                throw new \InvalidArgumentException("{$field} must be a number in [0, 1), got " . var_export($v, true));
            }
        }
        $this->criticalReserve = (float) $o['critical_reserve'];
        $this->sheddableShare = (float) $o['sheddable_share'];
        $this->leaseMs = max(1, BreakerConfig::toMs($this->lease));
        $this->ttlMs = max(1, BreakerConfig::toMs($this->keyTtl));
        $this->keys = Keys::bulkhead($name, $prefix);
        $this->script = Scripts::load(self::SCRIPT, $luaDir);
        Scripts::checkConnection($redis);
    }

    /**
     * Take one permit, waiting up to max_wait_duration for a release; throws BulkheadFull.
     * $priority: null (the default: all of the limit), 'critical' (all of it), 'normal' (all but
     * critical_reserve), 'sheddable' (at most sheddable_share), or an int (0 critical,
     * 1 normal, 2+ sheddable), so lower priorities are shed first, fleet-wide.
     */
    public function acquire(string|int|null $priority = null): BulkheadPermit
    {
        $share = $this->share($priority);
        $token = bin2hex(random_bytes(12));
        $started = self::monotonic();
        $deadline = $started + $this->maxWaitDuration;
        try {
            while (true) {
                $sent = self::monotonic();
                $remaining = $deadline - $sent;
                $wait = $remaining > 0 ? BreakerConfig::toMs($remaining) + self::WAITER_GRACE_MS : 0;
                $reply = $share >= self::MILLION ? $this->run('acquire', $token, $wait)
                    : $this->run('acquire', $token, $wait, (string) $share);
                if ($reply['ok']) {
                    return new BulkheadPermit($token, $sent);
                }
                if ($remaining <= 0) {
                    $waited = $this->maxWaitDuration > 0 ? self::monotonic() - $started : 0.0;
                    throw new BulkheadFull($this->name, $reply['limit'], $reply['in_use'], $waited);
                }
                // Block until a release wakes us, a lease may expire, or our time is up.
                $bound = $remaining;
                if ($reply['next_deadline_ms'] > 0) {
                    $bound = min($bound, $reply['next_deadline_ms'] / 1000.0 + self::DEADLINE_SLACK);
                }
                $this->block(max(self::MIN_BLOCK, $bound));
            }
        } catch (\RedisException $e) {
            if ($this->fallbackLimit === 0) {
                throw new BulkheadFull($this->name, 0, 0);
            }
            return new BulkheadPermit(''); // fail open: this process runs one call at a time
        }
    }

    /**
     * Give the permit back (once); a lease that had already expired is marked lost.
     * $error (null: the call returned) is what an adaptive limit learns from: a failure
     * or timeout cuts it, an Overloaded (or an HTTP 429 response) also pauses increases.
     */
    public function release(BulkheadPermit $permit, ?\Throwable $error = null): void
    {
        if ($permit->released) {
            return;
        }
        $permit->released = true;
        if ($permit->token === '' || $permit->lost) {
            return;
        }
        $tail = [];
        if ($this->adaptive !== null) {
            [$outcome, $retryAfterMs] = self::outcomeOf($error);
            if ($outcome !== '') {
                $latencyMs = max(0, BreakerConfig::toMs(self::monotonic() - $permit->acquiredAt));
                $tail = [$outcome, (string) $latencyMs, (string) $retryAfterMs];
            }
        }
        try {
            if (!$this->run('release', $permit->token, 0, ...$tail)['ok']) {
                $this->markLost($permit, 'release');
            }
        } catch (\RedisException) {
            // the lease expires on its own
        }
    }

    /** Push the lease deadline out by one lease (for long calls); false when it was lost. */
    public function renew(BulkheadPermit $permit): bool
    {
        if ($permit->token === '' || $permit->released || $permit->lost) {
            return false;
        }
        if ($this->run('renew', $permit->token)['ok']) {
            return true;
        }
        $this->markLost($permit, 'renewal');
        return false;
    }

    /** Run $fn holding a permit; with a $fallback, BulkheadFull returns $fallback($error). */
    public function call(callable $fn, ?callable $fallback = null, string|int|null $priority = null): mixed
    {
        try {
            $permit = $this->acquire($priority);
        } catch (BulkheadFull $full) {
            if ($fallback === null) {
                throw $full;
            }
            return $fallback($full);
        }
        try {
            $result = $fn();
        } catch (\Throwable $error) {
            $this->release($permit, $error);
            throw $error;
        }
        $this->release($permit);
        return $result;
    }

    /** Slow start: an adaptive limit restarts at its minimum (after a recovery); a fixed one is left alone. */
    public function restartLimit(): void
    {
        if ($this->adaptive !== null) {
            $this->run('restart', '');
        }
    }

    /** The share of the limit (millionths) calls of $priority may use (Python's priority_share). */
    public function share(string|int|null $priority): int
    {
        if ($priority === null) {
            return self::MILLION;  // a call without a priority may use the whole limit
        }
        $level = self::priorityLevel($priority);
        if ($level <= 0) {
            return self::MILLION;
        }
        $normal = 1.0 - $this->criticalReserve;
        $share = $level === 1 ? $normal : min($normal, $this->sheddableShare);
        return max(1, BreakerConfig::roundHalfEven($share * self::MILLION));
    }

    /** 0 critical, 1 normal (the default), 2 and above sheddable. */
    public static function priorityLevel(string|int|null $priority): int
    {
        if ($priority === null) {
            return 1;
        }
        if (is_string($priority) && isset(self::PRIORITIES[strtolower($priority)])) {
            return self::PRIORITIES[strtolower($priority)];
        }
        if (is_int($priority) && $priority >= 0) {
            return $priority;
        }
        throw new \InvalidArgumentException('priority must be one of ' . implode(', ', array_keys(self::PRIORITIES)) . ' or an int >= 0, got ' . var_export($priority, true));
    }

    /**
     * What a finished call reports to an adaptive limit: [outcome, Retry-After ms] with
     * outcome 'ok', 'drop' (a failure or timeout), '429' (Overloaded, or an exception
     * carrying a PSR-7 response with status 429, e.g. Guzzle's), or '' for distbreaker's
     * own rejections (the call never reached the dependency). Python's outcome_of.
     *
     * @return array{0: string, 1: int}
     */
    public static function outcomeOf(?\Throwable $error): array
    {
        if ($error === null) {
            return ['ok', 0];
        }
        if ($error instanceof BulkheadFull || $error instanceof CallNotPermitted) {
            return ['', 0];
        }
        if ($error instanceof Overloaded) {
            return ['429', BreakerConfig::roundHalfEven($error->retryAfter * 1000)];
        }
        $response = method_exists($error, 'getResponse') ? $error->getResponse() : null;
        if (is_object($response) && method_exists($response, 'getStatusCode') && $response->getStatusCode() === 429) {
            $header = method_exists($response, 'getHeaderLine') ? trim((string) $response->getHeaderLine('Retry-After')) : '';
            $seconds = is_numeric($header) && (float) $header > 0 ? (float) $header : 0.0;
            return ['429', BreakerConfig::roundHalfEven($seconds * 1000)];
        }
        return ['drop', 0];
    }

    /** @return array{ok: bool, in_use: int, limit: int, waiting: int, rejected: int, next_deadline_ms: int, now_ms: int, lost: int, acquired: int} */
    public function metrics(): array
    {
        return $this->run('metrics', '');
    }

    /** @return array{ok: bool, in_use: int, limit: int, waiting: int, rejected: int, next_deadline_ms: int, now_ms: int, lost: int, acquired: int} */
    private function run(string $op, string $token, int $extra = 0, string ...$tail): array
    {
        $k = $this->keys;
        // ARGV as lua/bulkhead.lua documents it: [7] the adaptive limit ('' = fixed),
        // then [8..10] a priority share (acquire) or outcome, latency, Retry-After (release)
        $raw = Scripts::run(
            $this->redis,
            $this->script,
            [$k['leases'], $k['meta'], $k['notify']],
            [$op, $token, $this->maxConcurrentCalls, $this->leaseMs, $this->ttlMs, $extra,
             $this->adaptive?->wire() ?? '', ...$tail],
        );
        if (is_int($raw)) {  // the hot paths (a granted acquire, a release) answer 1
            $raw = array_pad([$raw], 9, 0);
        }
        Scripts::expectArray($raw);
        if (count($raw) < 9) {
            throw new SchemaError('unexpected bulkhead script reply: ' . var_export($raw, true));
        }
        $v = array_map('intval', $raw);
        return [
            'ok' => $v[0] === 1, 'in_use' => $v[1], 'limit' => $v[2], 'waiting' => $v[3], 'rejected' => $v[4],
            'next_deadline_ms' => $v[5], 'now_ms' => $v[6], 'lost' => $v[7], 'acquired' => $v[8],
        ];
    }

    /** BLPOP the notify list with a fractional timeout (phpredis 5 blPop takes whole seconds). */
    private function block(float $seconds): void
    {
        $notify = $this->keys['notify'];
        $timeout = sprintf('%.3f', $seconds);
        $redis = Scripts::client($this->redis);
        if ($redis instanceof \RedisCluster) {
            $redis->rawCommand($notify, 'BLPOP', $notify, $timeout);
        } else {
            $redis->rawCommand('BLPOP', $notify, $timeout);
        }
    }

    private function markLost(BulkheadPermit $permit, string $when): void
    {
        if (!$permit->lost) {
            $permit->lost = true;
            error_log("distbreaker: bulkhead '{$this->name}': the lease of permit {$permit->token} was lost (found gone at {$when})");
        }
    }

    private static function monotonic(): float
    {
        return hrtime(true) / 1e9;
    }
}
