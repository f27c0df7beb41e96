<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * A circuit breaker shared with every process (PHP or Python) on the same Redis.
 *
 * The state machine lives only in lua/breaker.lua; this class builds KEYS/ARGV,
 * decodes replies and keeps the same local view as Python's codec: a known
 * CLOSED breaker permits without a round trip, a known OPEN wait rejects
 * locally, anything else asks the script (acquire).
 *
 *     $breaker = new CircuitBreaker($redis, 'payments', ['failure_rate_threshold' => 50]);
 *     $result = $breaker->call(fn () => Http::post(...), fn () => ['status' => 'queued']);
 */
final class CircuitBreaker
{
    public const SCRIPT = 'breaker';
    private const PERMITTING = ['CLOSED' => true, 'DISABLED' => true, 'METRICS_ONLY' => true];

    public readonly BreakerConfig $config;
    public readonly string $wire;
    /** The config fingerprint every call sends (ARGV[2]): see configFingerprint(). */
    public readonly int $fingerprint;
    /** @var array{state: string, meta: string, probes: string, history: string, channel: string} */
    public readonly array $keys;
    /** The fleet's stored config when it differs from this process's, else null. */
    public ?string $configDrift = null;
    /** Calls this instance rejected (locally or by the script). */
    public int $notPermitted = 0;

    /** @var array{source: string, sha: string} */
    private array $script;
    private ?string $view = null;      // null: unknown, ask Redis
    private float $openDeadline = 0.0; // monotonic seconds
    private int $viewNowMs = 0;
    private string $viewReason = '';   // why the viewed state, who set it: for CallNotPermitted
    private string $viewActor = '';
    private bool $viewHeld = false;    // the last reply showed an operator's override
    private int $slowMs;
    /** @var list<callable(array{name: string, from: string, to: string, reason: string, at_ms: int}): void> */
    private array $listeners = [];
    private static bool $driftWarned = false;
    /** Whether the next acquire or record says hello (docs/KEY_SCHEMA.md, "Config rollouts"). */
    private bool $helloDue;
    private string $worker;
    /** An operator's injected faults, when the config allows them ('allow_fault_injection'). */
    private ?FaultInjection $faults = null;

    /**
     * @param array<string, mixed> $config Python BreakerConfig option names, plus
     *        'prefix' (default 'distbreaker'), 'lua_dir' (default: the package's lua/) and 'hello_rate'
     *        (default 0.125: the share of objects whose first call says hello; docs/OPERATIONS.md)
     */
    public function __construct(
        private readonly \Redis|\RedisCluster|Connection $redis,
        public readonly string $name,
        array $config = [],
    ) {
        $prefix = $config['prefix'] ?? Keys::DEFAULT_PREFIX;
        $luaDir = $config['lua_dir'] ?? null;
        $helloRate = (float) ($config['hello_rate'] ?? 0.125);
        $allowFaults = $config['allow_fault_injection'] ?? false;
        if (!is_bool($allowFaults)) {
            throw new \InvalidArgumentException('allow_fault_injection must be a bool');
        }
        unset($config['prefix'], $config['lua_dir'], $config['hello_rate'], $config['allow_fault_injection']);
        // A PHP-FPM child keeps no state between requests: it says hello on a sample of its
        // objects' first calls (keeping its config counted as running), and always on the
        // call after a reply showed drift (so a new config is adopted at its second call).
        $this->worker = gethostname() . ':' . getmypid() . ':php';
        $this->helloDue = $helloRate >= 1.0 || ($helloRate > 0.0 && mt_rand() / mt_getrandmax() < $helloRate);
        $this->config = new BreakerConfig($config);
        $this->wire = $this->config->toWire();
        $this->fingerprint = self::configFingerprint($this->wire);
        // pub/sub ignores databases: each has its own events channel (KEY_SCHEMA.md)
        $db = $redis instanceof \Redis ? (int) $redis->getDbNum() : 0;
        $this->keys = Keys::breaker($name, $prefix, $db);
        $this->slowMs = BreakerConfig::toMs($this->config->slowCallDuration);
        $this->script = Scripts::load(self::SCRIPT, $luaDir);
        Scripts::checkConnection($redis);
        if ($allowFaults) {
            $this->faults = new FaultInjection($redis, $name, $prefix, $luaDir);
        }
    }

    /** Call $listener(array event) for every transition this process's calls make. */
    public function onTransition(callable $listener): void
    {
        $this->listeners[] = $listener;
    }

    // -- the protected call ------------------------------------------------------

    /** Ask for permission to make one call; throws CallNotPermitted. */
    public function acquire(): Permit
    {
        $injected = $this->faults?->rejection();
        if ($injected !== null) {
            $this->notPermitted++;
            throw $injected;
        }
        $now = self::monotonic();
        if ($this->view !== null && isset(self::PERMITTING[$this->view])) {
            return new Permit(); // CLOSED: no round trip before the call
        }
        if ($this->view === 'OPEN' && $now < $this->openDeadline) {
            $this->notPermitted++;
            throw new CallNotPermitted($this->name, 'OPEN', $this->openDeadline - $now, $this->viewReason, null, $this->viewActor);
        }
        $token = bin2hex(random_bytes(8));
        try {
            $reply = $this->execute('acquire', $token);
        } catch (\RedisException $e) {
            return $this->redisDown($e);
        }
        if ($reply['permitted']) {
            return new Permit($reply['state'] === 'HALF_OPEN' ? $token : '');
        }
        $this->notPermitted++;
        $wait = $reply['wait_ms'] / 1000.0;
        if ($reply['state'] === 'FORCED_OPEN' && $reply['override_until_ms'] > 0) {
            $wait = ($reply['override_until_ms'] - $reply['now_ms']) / 1000.0; // the override's remaining time
        }
        throw new CallNotPermitted($this->name, $reply['state'], $wait, $reply['reason'], null, $reply['actor']);
    }

    /** Alias of acquire() (Ganesha / Resilience4j wording). */
    public function allow(): Permit
    {
        return $this->acquire();
    }

    /**
     * Report how a permitted call ended.
     *
     * $error: null or false = success, true = failure, a Throwable = classified
     * like Python (ignore_exceptions / ignore_predicate win, then
     * record_exceptions / record_predicate; with neither, every Throwable fails).
     */
    public function record(Permit $permit, \Throwable|bool|null $error, float $durationSeconds): void
    {
        $outcome = $this->outcome($error);
        if ($outcome === 'ignored') {
            if ($permit->token === '') {
                return;
            }
            $args = [$permit->token, 0, 0, 0, 0];
        } else {
            $ms = max(0, BreakerConfig::toMs($durationSeconds));
            $failed = $outcome === 'failure';
            $args = [$permit->token, $failed ? 0 : 1, $failed ? 1 : 0, $ms > $this->slowMs ? 1 : 0, $ms];
        }
        try {
            if ($outcome === 'success' && $args[3] === 0 && $this->compactRecord($permit, $args[4])) {
                return;
            }
            $this->execute('record', ...$args);
        } catch (\RedisException $e) {
            $this->view = null; // the outcome is lost; never fail the caller for it
        }
    }

    /**
     * The compact record (docs/KEY_SCHEMA.md, "The compact record"): ARGV {fingerprint, ms}
     * for a plain success while the view is CLOSED, answered by the server time in ms;
     * false when it cannot be sent, or the script answered 0 (send the full form).
     */
    private function compactRecord(Permit $permit, int $ms): bool
    {
        if ($permit->token !== '' || $this->view !== 'CLOSED' || $this->configDrift !== null
            || $this->helloDue || $this->viewHeld || $this->config->slidingWindowType !== 'COUNT_BASED') {
            return false;
        }
        try {
            $raw = Scripts::run($this->redis, $this->script, [$this->keys['state']], [$this->fingerprint, $ms]);
        } catch (\RedisException $e) {
            $this->view = null;
            throw $e;
        }
        if (!is_int($raw) || $raw <= 0) {
            return false;
        }
        if ($raw >= $this->viewNowMs) {
            $this->viewNowMs = $raw;
            $this->view = 'CLOSED';
            $this->viewReason = $this->viewActor = '';
        }
        return true;
    }

    /**
     * Run $fn under the breaker. With a $fallback, a rejection (CallNotPermitted)
     * or a call that failed (classified as a failure) returns $fallback($error)
     * instead; errors classified as ignored or success (e.g. client errors you
     * configured so) are rethrown, so a fallback never hides them.
     */
    public function call(callable $fn, ?callable $fallback = null): mixed
    {
        try {
            $permit = $this->acquire();
        } catch (CallNotPermitted $rejected) {
            if ($fallback === null) {
                throw $rejected;
            }
            return $fallback($rejected);
        }
        $started = hrtime(true);
        try {
            $this->faults?->disturb(); // an operator's injected latency / error, if allowed
            $result = $fn();
        } catch (\Throwable $error) {
            $this->record($permit, $error, (hrtime(true) - $started) / 1e9);
            if ($fallback !== null && $this->outcome($error) === 'failure') {
                return $fallback($error);
            }
            throw $error;
        }
        $this->record($permit, null, (hrtime(true) - $started) / 1e9);
        return $result;
    }

    /** 'success', 'failure' or 'ignored', in Resilience4j's order (same as Python). */
    public function outcome(\Throwable|bool|null $error): string
    {
        if ($error === null || $error === false) {
            return 'success';
        }
        if ($error === true) {
            return 'failure';
        }
        $c = $this->config;
        foreach ($c->ignoreExceptions as $class) {
            if ($error instanceof $class) {
                return 'ignored';
            }
        }
        if ($c->ignorePredicate !== null && ($c->ignorePredicate)($error)) {
            return 'ignored';
        }
        $recorded = true;
        if ($c->recordExceptions !== [] || $c->recordPredicate !== null) {
            $recorded = false;
            foreach ($c->recordExceptions as $class) {
                $recorded = $recorded || $error instanceof $class;
            }
            if (!$recorded && $c->recordPredicate !== null) {
                $recorded = (bool) ($c->recordPredicate)($error);
            }
        }
        return $recorded ? 'failure' : 'success';
    }

    // -- state, metrics, operator actions ---------------------------------------

    /** The fleet-wide state, read from Redis (OPEN becomes HALF_OPEN by time here too). */
    public function state(): string
    {
        return $this->execute('state')['state'];
    }

    /**
     * Window figures (rates in percent, -1 below the minimum number of calls).
     *
     * @return array<string, int|float|string>
     */
    public function metrics(): array
    {
        $r = $this->execute('state');
        $minimum = $r['probe_figures'] ? $this->config->permittedCallsInHalfOpen : $this->config->effectiveMinimumCalls();
        $rate = static fn (int $part): float => ($r['calls'] <= 0 || $r['calls'] < $minimum) ? -1.0 : round($part * 100.0 / $r['calls'], 2);
        return [
            'state' => $r['state'],
            'failure_rate' => $rate($r['failures']),
            'slow_call_rate' => $rate($r['slow']),
            'calls' => $r['calls'],
            'failed' => $r['failures'],
            'slow' => $r['slow'],
            'not_permitted' => $this->notPermitted,
            'rejected_fleet_wide' => $r['rejected'],
            'probes_in_flight' => $r['probes_in_flight'],
        ];
    }

    /** Back to CLOSED with an empty window; this process's config becomes the stored one. */
    public function reset(string $reason = 'reset', string $actor = ''): string
    {
        return $this->execute('set', 'RESET', $reason, $actor)['state'];
    }

    /**
     * Force OPEN now; probes start after the wait, or after $forSeconds / at $untilEpoch
     * (Resilience4j's transitionToOpenStateFor / Until). On an OPEN breaker the wait restarts.
     */
    public function trip(string $reason = 'tripped', string $actor = '', ?float $forSeconds = null,
                         ?float $untilEpoch = null): string
    {
        return $this->execute('set', 'TRIP', $reason, $actor, ...self::holdArgs($forSeconds, $untilEpoch))['state'];
    }

    /**
     * Operator transition to CLOSED, FORCED_OPEN, DISABLED or METRICS_ONLY; with $forSeconds
     * or $untilEpoch (epoch seconds) it ends by Redis server time: FORCED_OPEN then probes
     * (HALF_OPEN), DISABLED and METRICS_ONLY return to CLOSED, a held CLOSED may trip again.
     */
    public function transitionTo(string $state, string $reason = 'by operator', string $actor = '',
                                 ?float $forSeconds = null, ?float $untilEpoch = null): string
    {
        return $this->execute('set', $state, $reason, $actor, ...self::holdArgs($forSeconds, $untilEpoch))['state'];
    }

    /** @return list<string> the set op's ARGV[9..10] (docs/KEY_SCHEMA.md) */
    private static function holdArgs(?float $forSeconds, ?float $untilEpoch): array
    {
        if ($forSeconds === null && $untilEpoch === null) {
            return [];
        }
        if ($forSeconds !== null && $untilEpoch !== null) {
            throw new \InvalidArgumentException('give $forSeconds or $untilEpoch, not both');
        }
        if ($forSeconds !== null) {
            $ms = (int) round($forSeconds * 1000);
            if ($ms < 1) {
                throw new \InvalidArgumentException("forSeconds must be at least 0.001, got {$forSeconds}");
            }
            return [(string) $ms, ''];
        }
        return ['', (string) (int) round($untilEpoch * 1000)];
    }

    // -- wire ------------------------------------------------------------------

    /**
     * ARGV[2] of every breaker call: the first 12 hex digits of the SHA-1 of the config
     * wire string, as an integer (the state record keeps the stored config's, so the
     * script compares two integers instead of parsing the wire string on every call).
     */
    public static function configFingerprint(string $wire): int
    {
        return intval(substr(sha1($wire), 0, 12), 16); // 48 bits: an int on 64-bit PHP
    }

    /**
     * Run one breaker op and refresh the local view from the reply.
     *
     * @return array{state: string, wait_ms: int, permitted: bool, transitions: list<array{0: string, 1: string, 2: string}>,
     *               calls: int, failures: int, slow: int, total_ms: int, rejected: int, drift: bool,
     *               stored_config: string, now_ms: int, since_ms: int, probes_in_flight: int,
     *               override_until_ms: int, probe_figures: bool, reason: string, actor: string}
     */
    public function execute(string $op, string|int ...$extra): array
    {
        $k = $this->keys;
        try {
            $raw = Scripts::run(
                $this->redis,
                $this->script,
                [$k['state'], $k['meta'], $k['probes'], $k['history']],
                [$op, $this->fingerprintArg($op), $this->wire, $this->name, $k['channel'], ...$extra],
            );
        } catch (\RedisException $e) {
            $this->view = null;
            throw $e;
        }
        $reply = self::decode($raw);
        $this->apply($reply);
        return $reply;
    }

    /** ARGV[2]: the fingerprint, or a hello '<fp>@<worker>' on a protected call when one is due. */
    private function fingerprintArg(string $op): string|int
    {
        if (!$this->helloDue || ($op !== 'acquire' && $op !== 'record')) {
            return $this->fingerprint;
        }
        $this->helloDue = false;
        return $this->fingerprint . '@' . $this->worker;
    }

    /**
     * Decode the script's reply array (docs/KEY_SCHEMA.md, "Reply"): the full reply, or
     * the short one {state, now_ms, since_ms} of a permitted acquire or record that changed nothing a worker
     * must know (no transition, drift, override or event error; a permitting state).
     */
    public static function decode(mixed $raw): array
    {
        if (is_array($raw) && count($raw) === 3) {
            return [
                'state' => (string) $raw[0],
                'wait_ms' => 0,
                'permitted' => true,
                'transitions' => [],
                'calls' => 0,
                'failures' => 0,
                'slow' => 0,
                'total_ms' => 0,
                'rejected' => 0,
                'drift' => false,
                'stored_config' => '',
                'now_ms' => (int) $raw[1],
                'since_ms' => (int) $raw[2],
                'probes_in_flight' => 0,
                'override_until_ms' => 0,
                'probe_figures' => false,
                'reason' => '',
                'actor' => '',
            ];
        }
        Scripts::expectArray($raw);
        if (count($raw) < 14) {
            throw new SchemaError('unexpected breaker script reply: ' . var_export($raw, true));
        }
        return [
            'state' => (string) $raw[0],
            'wait_ms' => (int) $raw[1],
            'permitted' => (int) $raw[2] === 1,
            'transitions' => array_map(static fn ($t) => [(string) $t[0], (string) $t[1], (string) $t[2]], $raw[3] ?: []),
            'calls' => (int) $raw[4],
            'failures' => (int) $raw[5],
            'slow' => (int) $raw[6],
            'total_ms' => (int) $raw[7],
            'rejected' => (int) $raw[8],
            'drift' => (int) $raw[9] === 1,
            'stored_config' => (string) $raw[10],
            'now_ms' => (int) $raw[11],
            'since_ms' => (int) $raw[12],
            'probes_in_flight' => (int) $raw[13],
            'override_until_ms' => count($raw) > 17 ? (int) $raw[17] : 0,
            // calls..total_ms are the half-open probes' (HALF_OPEN, or OPEN after a failed verdict)
            'probe_figures' => count($raw) > 18 ? (int) $raw[18] === 1 : (string) $raw[0] === 'HALF_OPEN',
            // why the breaker is in this state, and who put it there (an operator)
            'reason' => count($raw) > 16 ? (string) $raw[14] : '',
            'actor' => count($raw) > 16 ? (string) $raw[15] : '',
        ];
    }

    private function apply(array $reply): void
    {
        if ($reply['now_ms'] >= $this->viewNowMs) {
            $this->viewNowMs = $reply['now_ms'];
            $this->view = $reply['state'];
            $this->openDeadline = self::monotonic() + $reply['wait_ms'] / 1000.0;
            $this->viewReason = $reply['reason'];
            $this->viewActor = $reply['actor'];
            $this->viewHeld = $reply['override_until_ms'] > 0;
        }
        if ($reply['drift']) {
            $first = $this->configDrift === null;
            $this->configDrift = $reply['stored_config'];
            if ($first) {
                $this->helloDue = true; // the next call says hello: a newer config is adopted then
            } elseif (!self::$driftWarned) {
                // still drifting after a hello: this config is not in force and will not become it
                self::$driftWarned = true;
                error_log("distbreaker: circuit breaker '{$this->name}': this process's config '{$this->wire}' is not "
                    . "the one in force ('{$reply['stored_config']}') and will not become it by itself; the config "
                    . "in force governs (docs/OPERATIONS.md, \"Changing a breaker's config\")");
            }
        } else {
            $this->configDrift = null;
        }
        foreach ($reply['transitions'] as [$from, $to, $reason]) {
            $event = ['name' => $this->name, 'from' => $from, 'to' => $to, 'reason' => $reason, 'at_ms' => $reply['now_ms']];
            foreach ($this->listeners as $listener) {
                try {
                    $listener($event);
                } catch (\Throwable $e) {
                    error_log("distbreaker: transition listener failed: {$e->getMessage()}");
                }
            }
        }
    }

    /** Redis unreachable while acquiring: fail_open runs the call, fail_closed rejects it. */
    private function redisDown(\RedisException $error): Permit
    {
        if ($this->config->onRedisError === 'fail_closed') {
            $this->notPermitted++;
            throw new CallNotPermitted($this->name, 'UNKNOWN', 0.0, "redis unavailable: {$error->getMessage()}", $error);
        }
        return new Permit();
    }

    private static function monotonic(): float
    {
        return hrtime(true) / 1e9;
    }
}
