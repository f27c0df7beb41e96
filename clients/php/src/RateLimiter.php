<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * A fleet-wide rate limiter over lua/ratelimiter.lua (GCRA with reservations, Redis
 * time), shared with Python's distbreaker.RateLimiter of the same name: the same key,
 * script and arguments. Options and defaults are Python's RateLimiterConfig:
 * limit_for_period (50), limit_refresh_period (0.5 s), timeout_duration (5 s), burst
 * (the limit), key_ttl (1 h, at least twice timeout + period), on_redis_error
 * ('fail_open' | 'fail_closed'), plus 'prefix' and 'lua_dir'.
 *
 * A call that can run within its timeout reserves its permits and sleeps (usleep)
 * until they are due, so callers of every language are served in the order they
 * reached Redis. While Redis is unreachable, fail_open lets calls through (a PHP-FPM
 * request keeps no state to limit them with) and fail_closed refuses them.
 */
final class RateLimiter
{
    public const SCRIPT = 'ratelimiter';
    public const DEFAULTS = [
        'limit_for_period' => 50, 'limit_refresh_period' => 0.5, 'timeout_duration' => 5.0,
        'burst' => null, 'key_ttl' => null, 'on_redis_error' => 'fail_open',
    ];
    private const MAX_PRODUCT = 9000000000000;

    public readonly int $limitForPeriod;
    public readonly float $limitRefreshPeriod;
    public readonly float $timeoutDuration;
    public readonly int $burst;
    public readonly bool $failClosed;
    private readonly string $prefix;
    /** @var array{source: string, sha: string} */
    private array $script;
    /** @var list<string> ARGV[2..5]: limit, period ms, burst, key ttl ms */
    private array $args;

    /** @param array<string, mixed> $config */
    public function __construct(private readonly \Redis|\RedisCluster|Connection $redis, public readonly string $name, array $config = [])
    {
        $this->prefix = $config['prefix'] ?? Keys::DEFAULT_PREFIX;
        $luaDir = $config['lua_dir'] ?? null;
        unset($config['prefix'], $config['lua_dir']);
        Options::refuseUnknown($config, 'rate limiter', self::DEFAULTS);
        $o = $config + self::DEFAULTS;
        $limit = $o['limit_for_period'];
        if (!is_int($limit) || $limit < 1 || $limit > 1000000000) {
            throw new \InvalidArgumentException('limit_for_period must be an integer in [1, 1000000000], got ' . var_export($limit, true));
        }
        $burst = $o['burst'] ?? $limit;
        if (!is_int($burst) || $burst < 1 || $burst > 1000000000) {
            throw new \InvalidArgumentException('burst must be an integer in [1, 1000000000], got ' . var_export($burst, true));
        }
        foreach (['limit_refresh_period', 'timeout_duration'] as $field) {
            $v = $o[$field];
            if (!(is_int($v) || is_float($v)) || !is_finite((float) $v) || $v < 0) {
                throw new \InvalidArgumentException("{$field} must be a finite duration >= 0 seconds, got " . var_export($v, true));
            }
        }
        if ($o['limit_refresh_period'] < 0.001) {
            throw new \InvalidArgumentException('limit_refresh_period must be >= 0.001 seconds, got ' . var_export($o['limit_refresh_period'], true));
        }
        $periodMs = max(1, BreakerConfig::toMs((float) $o['limit_refresh_period']));
        if ($limit * $periodMs > self::MAX_PRODUCT) {
            throw new \InvalidArgumentException("limit_for_period x limit_refresh_period (ms) must be <= 9e12, got {$limit} per {$periodMs} ms");
        }
        $floor = 2 * ((float) $o['timeout_duration'] + (float) $o['limit_refresh_period']);
        $ttl = $o['key_ttl'] ?? max(3600.0, $floor);
        if (!(is_int($ttl) || is_float($ttl)) || $ttl < $floor) {
            throw new \InvalidArgumentException(sprintf('key_ttl must be >= %g seconds (twice timeout_duration + limit_refresh_period), got %s', $floor, var_export($ttl, true)));
        }
        if (!in_array($o['on_redis_error'], ['fail_open', 'fail_closed'], true)) {
            throw new \InvalidArgumentException("on_redis_error must be 'fail_open' or 'fail_closed', got " . var_export($o['on_redis_error'], true));
        }
        $this->limitForPeriod = $limit;
        $this->limitRefreshPeriod = (float) $o['limit_refresh_period'];
        $this->timeoutDuration = (float) $o['timeout_duration'];
        $this->burst = $burst;
        $this->failClosed = $o['on_redis_error'] === 'fail_closed';
        $this->args = [(string) $limit, (string) $periodMs, (string) $burst, (string) BreakerConfig::toMs((float) $ttl)];
        $this->script = Scripts::load(self::SCRIPT, $luaDir);
        Scripts::checkConnection($redis);
    }

    /** The Redis key of this limiter, or of its instance for $key ("<name>:<key>"). */
    public function key(?string $key = null): string
    {
        return Keys::rateLimiter($key === null ? $this->name : "{$this->name}:{$key}", $this->prefix)['bucket'];
    }

    /**
     * Reserve $permits: ['wait' => seconds to wait before using them, 'run_at_ms' => the
     * server time they are due (0 while Redis is down under fail_open)], or throw
     * RequestNotPermitted when the wait would exceed $timeout (default timeout_duration).
     *
     * @return array{wait: float, run_at_ms: int}
     */
    public function reserve(int $permits = 1, ?string $key = null, ?float $timeout = null): array
    {
        if ($permits < 1) {
            throw new \InvalidArgumentException("permits must be >= 1, got {$permits}");
        }
        $wait = max(0.0, $timeout ?? $this->timeoutDuration);
        try {
            $raw = Scripts::run($this->redis, $this->script, [$this->key($key)],
                ['acquire', ...$this->args, (string) $permits, (string) BreakerConfig::toMs($wait)]);
        } catch (\RedisException) {
            if ($this->failClosed) {
                throw new RequestNotPermitted($this->name, $permits, 0.0, 'Redis unavailable (fail_closed)');
            }
            return ['wait' => 0.0, 'run_at_ms' => 0];
        }
        if (!is_array($raw) || count($raw) < 4) {
            throw new SchemaError('unexpected rate limiter script reply: ' . var_export($raw, true));
        }
        [$ok, $waitMs, $nowMs] = [(int) $raw[0], (int) $raw[1], (int) $raw[2]];
        if ($ok !== 1) {
            if ($waitMs < 0) {
                throw new RequestNotPermitted($this->name, $permits, 0.0, "{$permits} permits exceed the burst");
            }
            throw new RequestNotPermitted($this->name, $permits, $waitMs / 1000.0);
        }
        return ['wait' => $waitMs / 1000.0, 'run_at_ms' => $nowMs + $waitMs];
    }

    /** Take $permits, sleeping until they are due (at most $timeout); throws RequestNotPermitted. */
    public function acquire(int $permits = 1, ?string $key = null, ?float $timeout = null): void
    {
        $wait = $this->reserve($permits, $key, $timeout)['wait'];
        if ($wait > 0) {
            usleep((int) ceil($wait * 1000000));
        }
    }

    /** acquire(), answering false instead of throwing. */
    public function tryAcquire(int $permits = 1, ?string $key = null, ?float $timeout = null): bool
    {
        try {
            $this->acquire($permits, $key, $timeout);
        } catch (RequestNotPermitted) {
            return false;
        }
        return true;
    }

    /**
     * Run $fn after taking one permit.
     *
     * @template T
     * @param callable(): T $fn
     * @return T
     */
    public function call(callable $fn): mixed
    {
        $this->acquire();
        return $fn();
    }

    /**
     * Fleet-wide figures (Redis only): available_permissions (negative while waiting
     * calls hold reservations), the limit in force, calls / permits / waited / rejected.
     *
     * @return array<string, int|float|bool>
     */
    public function metrics(?string $key = null): array
    {
        return $this->admin(['metrics'], $key);
    }

    /** Spend every permit the bucket holds now, fleet-wide (drainPermissions). */
    public function drain(?string $key = null): array
    {
        return $this->admin(['drain'], $key);
    }

    /** Change the limit for the whole fleet, at once (stored in Redis until resetLimit()). */
    public function changeLimitForPeriod(int $limitForPeriod, ?string $key = null): array
    {
        $now = $this->metrics($key);
        $burst = $now['burst'] === $now['limit_for_period'] ? $limitForPeriod : $now['burst'];
        return $this->admin(['set', $limitForPeriod, (int) round($now['limit_refresh_period'] * 1000), $burst], $key);
    }

    /** Drop an operator's limit: each worker's own config governs again. */
    public function resetLimit(?string $key = null): array
    {
        return $this->admin(['unset'], $key);
    }

    /** @param list<string|int> $op @return array<string, int|float|bool> */
    private function admin(array $op, ?string $key): array
    {
        [$name, $extra] = [$op[0], array_slice($op, 1)];
        $raw = Scripts::run($this->redis, $this->script, [$this->key($key)], [$name, ...$this->args, ...$extra]);
        if (!is_array($raw) || count($raw) < 10) {
            throw new SchemaError('unexpected rate limiter script reply: ' . var_export($raw, true));
        }
        $v = array_map('intval', $raw);
        return [
            'available_permissions' => $v[0], 'limit_for_period' => $v[1],
            'limit_refresh_period' => $v[2] / 1000.0, 'burst' => $v[3], 'calls' => $v[4],
            'permits' => $v[5], 'waited' => $v[6], 'rejected' => $v[7], 'overridden' => $v[9] === 1,
        ];
    }
}
