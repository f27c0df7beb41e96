<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * Named breakers, bulkheads, retry budgets and rate limiters built from one config, one
 * shared instance per name per process, all on one connection.
 *
 * The config has Resilience4j's shape with the Python option names (the same
 * shape as Python's distbreaker.Registry), per kind: named `configs` (the one
 * called `default` applies to instances without a `base_config` and to names
 * the config does not list) and `instances`:
 *
 *     new Registry($connection, [
 *         'prefix' => 'distbreaker',
 *         'breakers' => [
 *             'configs' => ['default' => ['failure_rate_threshold' => 50, 'wait_duration_in_open_state' => '30s']],
 *             'instances' => ['payments' => ['base_config' => 'default', 'minimum_number_of_calls' => 10]],
 *         ],
 *         'bulkheads' => ['instances' => ['payments' => ['max_concurrent_calls' => 25]]],
 *         'budgets' => ['instances' => ['payments' => ['percent_can_retry' => 0.2]]],
 *         'rate_limiters' => ['instances' => ['llm' => ['limit_for_period' => 90000, 'limit_refresh_period' => '1m']]],
 *     ]);
 *
 * Durations are seconds or strings such as '500ms', '30s', '1m30s', '1h', 'PT30S'.
 * Errors name the kind, the instance and the option.
 */
final class Registry
{
    /** kind => [config section, component class] */
    private const KINDS = [
        'breaker' => ['breakers', CircuitBreaker::class],
        'bulkhead' => ['bulkheads', Bulkhead::class],
        'budget' => ['budgets', RetryBudget::class],
        'rate_limiter' => ['rate_limiters', RateLimiter::class],
    ];
    private const TOP = ['prefix', 'lua_dir', 'redis', 'breakers', 'bulkheads', 'budgets', 'rate_limiters'];

    /** @var array<string, array<string, object>> kind => name => instance */
    private array $instances = [];
    /** @var array<string, array<string, array<string, mixed>>> kind => name => runtime-only options */
    private array $extra = [];

    /** @param array<string, mixed> $config see the class comment; 'redis' is ignored here (the connection's) */
    public function __construct(
        private readonly \Redis|\RedisCluster|Connection $redis,
        private readonly array $config = [],
    ) {
        $unknown = array_diff(array_keys($config), self::TOP);
        if ($unknown !== []) {
            sort($unknown);
            throw new \InvalidArgumentException('distbreaker config: unknown section(s) ' . implode(', ', $unknown)
                . ' (expected ' . implode(', ', self::TOP) . ')');
        }
        foreach (self::KINDS as [$section]) {
            $value = $config[$section] ?? [];
            if (!is_array($value) || array_diff(array_keys($value), ['configs', 'instances']) !== []) {
                throw new \InvalidArgumentException("distbreaker config: '{$section}' must be an array with 'configs' and/or 'instances'");
            }
        }
    }

    /** The connection every component of this registry uses. */
    public function connection(): \Redis|\RedisCluster|Connection
    {
        return $this->redis;
    }

    public function breaker(string $name): CircuitBreaker
    {
        /** @var CircuitBreaker */
        return $this->get('breaker', $name);
    }

    public function bulkhead(string $name): Bulkhead
    {
        /** @var Bulkhead */
        return $this->get('bulkhead', $name);
    }

    public function budget(string $name): RetryBudget
    {
        /** @var RetryBudget */
        return $this->get('budget', $name);
    }

    public function rateLimiter(string $name): RateLimiter
    {
        /** @var RateLimiter */
        return $this->get('rate_limiter', $name);
    }

    /**
     * Options that cannot live in a (cached) config file, such as predicates,
     * for one instance; call before its first use (e.g. in a service provider).
     *
     * @param array<string, mixed> $options
     */
    public function configure(string $kind, string $name, array $options): void
    {
        self::kind($kind);
        if (isset($this->instances[$kind][$name])) {
            throw new \LogicException("distbreaker {$kind} '{$name}' is already built; configure it before its first use");
        }
        $this->extra[$kind][$name] = $options + ($this->extra[$kind][$name] ?? []);
    }

    /**
     * The options instance $name of $kind is built with (defaults, base config,
     * instance options, runtime options; durations in seconds).
     *
     * @return array<string, mixed>
     */
    public function options(string $kind, string $name): array
    {
        [$section] = self::kind($kind);
        $configs = $this->config[$section]['configs'] ?? [];
        $own = $this->config[$section]['instances'][$name] ?? [];
        $where = "distbreaker config {$section}.instances.{$name}";
        if (!is_array($own)) {
            throw new \InvalidArgumentException("{$where} must be an array of options");
        }
        $base = $own['base_config'] ?? 'default';
        unset($own['base_config']);
        if (!is_string($base) || (!isset($configs[$base]) && $base !== 'default')) {
            throw new \InvalidArgumentException("{$where}.base_config: no config named " . var_export($base, true)
                . " in {$section}.configs");
        }
        $options = $own + ($configs[$base] ?? []);
        foreach ($options as $field => $value) {
            $options[$field] = self::duration($value, "{$where}.{$field}");
        }
        $options = ($this->extra[$kind][$name] ?? []) + $options;
        foreach (['prefix', 'lua_dir'] as $shared) {
            if (isset($this->config[$shared]) && !isset($options[$shared])) {
                $options[$shared] = $this->config[$shared];
            }
        }
        return $options;
    }

    private function get(string $kind, string $name): object
    {
        if (!isset($this->instances[$kind][$name])) {
            [$section, $class] = self::kind($kind);
            $options = $this->options($kind, $name);
            try {
                $this->instances[$kind][$name] = new $class($this->redis, $name, $options);
            } catch (\InvalidArgumentException $e) {
                throw new \InvalidArgumentException("distbreaker config {$section}.instances.{$name}: {$e->getMessage()}", 0, $e);
            }
        }
        return $this->instances[$kind][$name];
    }

    /** @return array{0: string, 1: class-string} */
    private static function kind(string $kind): array
    {
        if (!isset(self::KINDS[$kind])) {
            throw new \InvalidArgumentException("unknown component kind '{$kind}' (expected breaker, bulkhead, budget or rate_limiter)");
        }
        return self::KINDS[$kind];
    }

    /**
     * A duration string => seconds, by the same grammar as the Python library's one
     * parser (distbreaker._runtime.options.to_seconds): '30' (seconds), '30s', '250ms',
     * '1m30s', '1h 30m', '1.5h', '2d', ISO 8601 'PT30S' / 'P1DT2H'. A numeric string
     * (from env()) => its number; any other string unchanged (the component validates
     * it), except one starting with a digit: not a duration.
     */
    private static function duration(mixed $value, string $where): mixed
    {
        if (!is_string($value)) {
            return $value;
        }
        if (is_numeric($value)) {
            return preg_match('/^\s*-?\d+\s*$/', $value) ? (int) $value : (float) $value;
        }
        $text = trim($value);
        $number = '(\d+(?:\.\d*)?|\.\d+)';
        $iso = "/^P(?:{$number}W)?(?:{$number}D)?(?:T(?:{$number}H)?(?:{$number}M)?(?:{$number}S)?)?$/i";
        if (preg_match($iso, $text, $m) && !preg_match('/^PT?$/i', $text) && !preg_match('/T$/i', $text)) {
            $total = 0.0;
            foreach ([1 => 604800.0, 86400.0, 3600.0, 60.0, 1.0] as $i => $unit) {
                if (isset($m[$i]) && $m[$i] !== '') {
                    $total += (float) $m[$i] * $unit;
                }
            }
            return $total;
        }
        if (preg_match("/^(?:{$number}\s*(?:ms|s|m|h|d)\s*)+$/i", $text)) {
            preg_match_all("/{$number}\s*(ms|s|m|h|d)/i", $text, $parts, PREG_SET_ORDER);
            $factor = ['ms' => 0.001, 's' => 1.0, 'm' => 60.0, 'h' => 3600.0, 'd' => 86400.0];
            $total = 0.0;
            foreach ($parts as $part) {
                $total += (float) $part[1] * $factor[strtolower($part[2])];
            }
            return $total;
        }
        if (preg_match('/^\s*\d/', $value)) {
            throw new \InvalidArgumentException("{$where}: '{$value}' is not a duration (a number of seconds, "
                . "or e.g. '500ms', '30s', '1m30s', 'PT30S')");
        }
        return $value;
    }
}
