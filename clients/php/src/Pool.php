<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * A fleet-wide pool of upstream members with Envoy's outlier detection, over
 * lua/pool.lua: the same keys, script and arguments as Python's distbreaker.Pool of the
 * same name, so PHP and Python workers pick from one pool and eject its outliers
 * together. Options and defaults are Python's PoolConfig (Envoy's field names; durations
 * in seconds), plus 'prefix' and 'lua_dir'; 'members' are the static members (names, or
 * name => weight), put in Redis by a pick that finds the pool empty.
 *
 *     $pool = new Pool($redis, 'llm', ['members' => ['eu' => 2, 'us' => 1]]);
 *     $pick = $pool->pick();
 *     $response = $http->post("https://{$pick->member}/v1/chat", ...);
 *     $pool->record($pick, status: $response->getStatusCode(),
 *                   retryAfter: $response->getHeaderLine('Retry-After'));
 *
 * While Redis is unreachable a pick is a weighted random member this request knows
 * (the static members, those it saw ejected avoided) and outcomes are dropped.
 */
final class Pool
{
    public const SCRIPT = 'pool';
    public const BALANCES = ['in_flight', 'latency', 'random'];
    public const DEFAULTS = [
        'members' => [], 'balance' => 'in_flight', 'interval' => 10.0,
        'base_ejection_time' => 30.0, 'max_ejection_time' => 300.0, 'max_ejection_percent' => 10,
        'consecutive_5xx' => 5, 'enforcing_consecutive_5xx' => 100,
        'consecutive_gateway_failure' => 5, 'enforcing_consecutive_gateway_failure' => 0,
        'split_external_local_origin_errors' => false, 'consecutive_local_origin_failure' => 5,
        'enforcing_consecutive_local_origin_failure' => 100, 'success_rate_minimum_hosts' => 5,
        'success_rate_request_volume' => 100, 'success_rate_stdev_factor' => 1.9,
        'enforcing_success_rate' => 100, 'failure_percentage_threshold' => 85,
        'failure_percentage_minimum_hosts' => 5, 'failure_percentage_request_volume' => 50,
        'enforcing_failure_percentage' => 0, 'latency_factor' => 3.0, 'latency_threshold' => 0.1,
        'latency_percentile' => 50, 'latency_minimum_hosts' => 5, 'latency_request_volume' => 100,
        'enforcing_latency' => 100, 'healthy_panic_threshold' => 50, 'probe_calls' => 3,
        'max_call_duration' => 60.0, 'key_ttl' => 86400.0,
    ];
    /** The wire outcomes (KEY_SCHEMA, Pool: record's ARGV[5]). */
    public const OUTCOMES = ['success' => 's', '5xx' => 'e', 'gateway' => 'g', 'local' => 'l'];
    private const PERCENTS = ['max_ejection_percent', 'enforcing_consecutive_5xx',
        'enforcing_consecutive_gateway_failure', 'enforcing_consecutive_local_origin_failure',
        'enforcing_success_rate', 'failure_percentage_threshold', 'enforcing_failure_percentage',
        'enforcing_latency', 'healthy_panic_threshold'];
    private const COUNTS = ['consecutive_5xx', 'consecutive_gateway_failure',
        'consecutive_local_origin_failure', 'success_rate_minimum_hosts',
        'success_rate_request_volume', 'failure_percentage_minimum_hosts',
        'failure_percentage_request_volume', 'latency_minimum_hosts', 'latency_request_volume'];

    /** The config wire string (ARGV[2] of every call). */
    public readonly string $wire;
    /** @var array<string, int> static members, name => weight */
    public readonly array $members;
    private readonly string $prefix;
    /** @var array{source: string, sha: string} */
    private array $script;
    /** @var array<string, true> members this object saw ejected (the fallback avoids them) */
    private array $seenEjected = [];

    /** @param array<string, mixed> $config */
    public function __construct(private readonly \Redis|\RedisCluster|Connection $redis, public readonly string $name, array $config = [])
    {
        Keys::validateName($name);
        $this->prefix = $config['prefix'] ?? Keys::DEFAULT_PREFIX;
        $luaDir = $config['lua_dir'] ?? null;
        unset($config['prefix'], $config['lua_dir']);
        Options::refuseUnknown($config, 'pool', self::DEFAULTS);
        $o = $config + self::DEFAULTS;
        $this->members = self::normalizeMembers($o['members']);
        if (!in_array($o['balance'], self::BALANCES, true)) {
            throw new \InvalidArgumentException('balance must be one of ' . implode(', ', self::BALANCES) . ', got ' . var_export($o['balance'], true));
        }
        foreach (self::PERCENTS as $field) {
            self::checkInt($o[$field], $field, 0, 100);
        }
        foreach (self::COUNTS as $field) {
            self::checkInt($o[$field], $field, 0, 1000000000);
        }
        self::checkInt($o['probe_calls'], 'probe_calls', 1, 1000000);
        self::checkInt($o['latency_percentile'], 'latency_percentile', 1, 99);
        foreach (['interval', 'base_ejection_time', 'max_call_duration', 'key_ttl', 'max_ejection_time', 'latency_threshold'] as $field) {
            self::checkNumber($o[$field], $field, 0.0, 3155760000.0);
            if ($o[$field] <= 0 && !in_array($field, ['max_ejection_time', 'latency_threshold'], true)) {
                throw new \InvalidArgumentException("{$field} must be > 0 seconds, got " . var_export($o[$field], true));
            }
        }
        foreach (['success_rate_stdev_factor', 'latency_factor'] as $field) {
            self::checkNumber($o[$field], $field, 0.0, 1000000.0);
        }
        if (!is_bool($o['split_external_local_origin_errors'])) {
            throw new \InvalidArgumentException('split_external_local_origin_errors must be a bool, got ' . var_export($o['split_external_local_origin_errors'], true));
        }
        $ms = static fn (string $f): int => BreakerConfig::toMs((float) $o[$f]);
        $this->wire = implode(',', [
            $ms('interval'), $ms('base_ejection_time'), $ms('max_ejection_time'), $o['max_ejection_percent'],
            $o['consecutive_5xx'], $o['consecutive_gateway_failure'], $o['consecutive_local_origin_failure'],
            $o['enforcing_consecutive_5xx'], $o['enforcing_consecutive_gateway_failure'],
            $o['enforcing_consecutive_local_origin_failure'], (int) $o['split_external_local_origin_errors'],
            $o['success_rate_minimum_hosts'], $o['success_rate_request_volume'],
            BreakerConfig::roundHalfEven((float) $o['success_rate_stdev_factor'] * 1000), $o['enforcing_success_rate'],
            $o['failure_percentage_threshold'], $o['failure_percentage_minimum_hosts'],
            $o['failure_percentage_request_volume'], $o['enforcing_failure_percentage'],
            BreakerConfig::roundHalfEven((float) $o['latency_factor'] * 1000), $o['latency_minimum_hosts'],
            $o['latency_request_volume'], $o['enforcing_latency'], $o['healthy_panic_threshold'],
            $o['probe_calls'], max(1, $ms('max_call_duration')), max(1, $ms('key_ttl')),
            array_search($o['balance'], self::BALANCES, true), $ms('latency_threshold'), $o['latency_percentile'],
        ]);
        $this->script = Scripts::load(self::SCRIPT, $luaDir);
        Scripts::checkConnection($redis);
    }

    /** @return list<string> the pool's three keys in script order */
    public function keys(): array
    {
        return array_values(Keys::pool($this->name, $this->prefix));
    }

    /**
     * Choose a member (power of two choices among the members not ejected, fleet-wide);
     * $key: stickiness; $avoid: members not to choose unless nothing else is left. The
     * pick holds a lease until record() (or release()). Throws NoPoolMember.
     *
     * @param list<string> $avoid
     */
    public function pick(?string $key = null, array $avoid = []): PoolPick
    {
        try {
            $found = $this->pickOnce($key, $avoid);
            if ($found === null && $this->members !== []) {
                $this->setMembers($this->members, 'init'); // the keys had expired, or a new Redis
                $found = $this->pickOnce($key, $avoid);
            }
        } catch (\RedisException) {
            $found = $this->localPick($key, $avoid);
        }
        if ($found === null) {
            throw new NoPoolMember($this->name);
        }
        return $found;
    }

    /**
     * Record how a picked call went, once: $status (502/503/504 gateway failure, other
     * 5xx and 429 failure, the rest success), or $error (an Overloaded or any other
     * throwable: a failure), or $outcome ('success', '5xx', 'gateway', 'local': no
     * response). A Retry-After ($retryAfter, seconds) on a 429/503 (or an Overloaded's)
     * ejects the member that long, fleet-wide and within the cap. Returns the member's
     * state after the call (['state', 'until_ms', 'why', 'event']), null while Redis is
     * unreachable (the outcome is dropped).
     *
     * @return array{state: int, until_ms: int, why: int, event: string}|null
     */
    public function record(PoolPick $pick, ?int $status = null, ?\Throwable $error = null, ?string $outcome = null, float|int|string|null $retryAfter = null, ?float $duration = null): ?array
    {
        if ($pick->recorded) {
            throw new \LogicException("the pick of {$pick->member} was already recorded");
        }
        $pick->recorded = true;
        $code = self::outcomeOf($status, $error, $outcome);
        $ejectFor = 0;
        if ($code !== 's') {
            if ($error instanceof Overloaded && $error->retryAfter > 0) {
                $ejectFor = max(1, BreakerConfig::toMs($error->retryAfter));
            } elseif (in_array($status, [429, 503], true) && is_numeric($retryAfter) && (float) $retryAfter > 0) {
                $ejectFor = max(1, BreakerConfig::toMs((float) $retryAfter));
            }
        }
        $elapsed = $duration ?? max(0.0, microtime(true) - $pick->started);
        return $this->send($pick, $code, BreakerConfig::toMs($elapsed), $ejectFor);
    }

    /** Give a pick back without an outcome (the call was abandoned): only its lease goes. */
    public function release(PoolPick $pick): void
    {
        if (!$pick->recorded) {
            $pick->recorded = true;
            $this->send($pick, 'n', -1, 0);
        }
    }

    /**
     * Run $fn($pick->member, $pick) on a picked member and record the outcome: a
     * throwable is a failure (then thrown on), a return a success unless $fn set
     * $pick->status (and $pick->retryAfter) or $pick->outcome.
     *
     * @template T
     * @param callable(string, PoolPick): T $fn
     * @return T
     */
    public function call(callable $fn, ?string $key = null): mixed
    {
        $pick = $this->pick($key);
        try {
            $result = $fn($pick->member, $pick);
        } catch (\Throwable $error) {
            if (!$pick->recorded) {
                $this->record($pick, $pick->status, $error, $pick->outcome, $pick->retryAfter);
            }
            throw $error;
        }
        if (!$pick->recorded) {
            $this->record($pick, $pick->status, null, $pick->outcome, $pick->retryAfter);
        }
        return $result;
    }

    /**
     * Change the pool's members fleet-wide: $mode 'replace' (members kept keep their
     * health), 'add', 'remove', 'init' (only when the pool has none). Answers how many
     * members the pool has. Throws \RedisException while Redis is unreachable.
     *
     * @param array<int|string, int|string> $members names, or name => weight
     */
    public function setMembers(array $members, string $mode = 'replace'): int
    {
        if (!in_array($mode, ['replace', 'add', 'remove', 'init'], true)) {
            throw new \InvalidArgumentException("mode must be replace, add, remove or init, got {$mode}");
        }
        $flat = [];
        foreach (self::normalizeMembers($members) as $member => $weight) {
            $flat[] = $member;
            if ($mode !== 'remove') {
                $flat[] = $weight;
            }
        }
        $raw = Scripts::run($this->redis, $this->script, $this->keys(), ['members', $this->wire, $mode, ...$flat]);
        Scripts::expectArray($raw);
        return (int) $raw[0];
    }

    /**
     * Every member as the fleet sees it: member => ['record' => the 24 integers of
     * KEY_SCHEMA's member record, 'in_flight' => picks in flight]. Writes nothing.
     *
     * @return array<string, array{record: list<int>, in_flight: int}>
     */
    public function status(): array
    {
        $raw = Scripts::run($this->redis, $this->script, $this->keys(), ['status', '']);
        Scripts::expectArray($raw);
        $out = [];
        for ($i = 5; $i + 2 < count($raw); $i += 3) {
            $record = array_map('intval', preg_split('/ +/', trim((string) $raw[$i + 1])) ?: []);
            $out[(string) $raw[$i]] = ['record' => $record, 'in_flight' => (int) $raw[$i + 2]];
        }
        return $out;
    }

    /** The wire outcome (s, e, g, l) of a call, as Python's pool.core.outcome_of. */
    public static function outcomeOf(?int $status = null, ?\Throwable $error = null, ?string $outcome = null): string
    {
        if ($outcome !== null) {
            if (!isset(self::OUTCOMES[$outcome])) {
                throw new \InvalidArgumentException("outcome must be one of success, 5xx, gateway, local; got {$outcome}");
            }
            return self::OUTCOMES[$outcome];
        }
        if ($status === null) {
            return $error === null ? 's' : 'e';
        }
        if (in_array($status, [502, 503, 504], true)) {
            return 'g';
        }
        return ($status >= 500 || $status === 429) ? 'e' : 's';
    }

    /** @param list<string> $avoid */
    private function pickOnce(?string $key, array $avoid): ?PoolPick
    {
        foreach ($avoid as $member) {
            self::validateMember($member);
        }
        $token = bin2hex(random_bytes(8));
        $raw = Scripts::run($this->redis, $this->script, $this->keys(), ['pick', $this->wire, $token,
            random_int(0, 0x7fffffff), random_int(0, 0x7fffffff), $key ?? '', implode(' ', $avoid)]);
        Scripts::expectArray($raw);
        [$member, $mode] = [(string) $raw[0], (int) $raw[1]];
        if ($mode < 0 || $member === '') {
            return null;
        }
        return new PoolPick($member, $token, ['normal', 'panic', 'probe'][$mode] ?? 'normal', 'redis');
    }

    /** Redis unreachable: a weighted random static member not seen ejected (sticky by key). */
    private function localPick(?string $key, array $avoid): ?PoolPick
    {
        $known = array_filter($this->members, static fn (int $w): bool => $w > 0);
        $cands = array_diff_key($known, $this->seenEjected, array_flip($avoid)) ?: $known;
        if ($cands === []) {
            return null;
        }
        $draw = $key === null ? random_int(0, array_sum($cands) - 1) : crc32($key) % array_sum($cands);
        foreach ($cands as $member => $weight) {
            if ($draw < $weight) {
                return new PoolPick((string) $member, '', 'normal', 'local');
            }
            $draw -= $weight;
        }
        return null;
    }

    /** @return array{state: int, until_ms: int, why: int, event: string}|null */
    private function send(PoolPick $pick, string $code, int $durationMs, int $ejectForMs): ?array
    {
        $token = $pick->source === 'redis' ? $pick->token : '';
        try {
            $raw = Scripts::run($this->redis, $this->script, $this->keys(),
                ['record', $this->wire, $pick->member, $token, $code, $durationMs, $ejectForMs]);
        } catch (\RedisException) {
            return null;
        }
        Scripts::expectArray($raw);
        $change = ['state' => (int) $raw[0], 'until_ms' => (int) $raw[1], 'why' => (int) $raw[2], 'event' => (string) $raw[3]];
        if ($change['state'] === 1) {
            $this->seenEjected[$pick->member] = true;
        } else {
            unset($this->seenEjected[$pick->member]);
        }
        return $change;
    }

    /**
     * @param array<int|string, int|string> $members
     * @return array<string, int>
     */
    private static function normalizeMembers(mixed $members): array
    {
        if (!is_array($members)) {
            throw new \InvalidArgumentException('members must be a list of names or a map name => weight');
        }
        $out = [];
        foreach ($members as $k => $v) {
            [$member, $weight] = is_int($k) ? [$v, 1] : [$k, $v];
            self::validateMember($member);
            self::checkInt($weight, "weight of member {$member}", 0, 1000000);
            $out[$member] = $weight;
        }
        return $out;
    }

    private static function validateMember(mixed $member): void
    {
        if (!is_string($member) || strlen($member) < 1 || mb_strlen($member) > 200 || preg_match('/[\s\x00-\x1f\x7f]/', $member)) {
            throw new \InvalidArgumentException('a pool member must be 1-200 characters without whitespace or control characters, got ' . var_export($member, true));
        }
    }

    private static function checkInt(mixed $value, string $field, int $low, int $high): void
    {
        if (!is_int($value) || $value < $low || $value > $high) {
            throw new \InvalidArgumentException("{$field} must be an integer in [{$low}, {$high}], got " . var_export($value, true));
        }
    }

    private static function checkNumber(mixed $value, string $field, float $low, float $high): void
    {
        if (!(is_int($value) || is_float($value)) || !is_finite((float) $value) || $value < $low || $value > $high) {
            throw new \InvalidArgumentException("{$field} must be a number in [{$low}, {$high}], got " . var_export($value, true));
        }
    }
}
