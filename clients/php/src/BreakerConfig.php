<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * Resilience4j's circuit breaker settings with the same option names, the same
 * defaults, the same validation and the same wire string as Python's
 * distbreaker.BreakerConfig, so PHP and Python workers never drift apart.
 * Durations are seconds (int|float) here and integer milliseconds on the wire.
 */
final class BreakerConfig
{
    public const WIRE_VERSION = '1';
    public const MAX_COUNT_WINDOW = 100000;
    public const MAX_TIME_WINDOW = 3600;

    /** The options carried on the wire, with Python's defaults. */
    public const DEFAULTS = [
        'failure_rate_threshold' => 50.0,
        'slow_call_rate_threshold' => 100.0,
        'slow_call_duration' => 60.0,
        'sliding_window_type' => 'COUNT_BASED',
        'sliding_window_size' => 100,
        'minimum_number_of_calls' => 100,
        'wait_duration_in_open_state' => 60.0,
        'permitted_calls_in_half_open' => 10,
        'max_wait_in_half_open' => 0.0,
        'half_open_lease' => 60.0,
        'key_ttl' => 3600.0,
        'initial_state' => 'CLOSED',
        'transition_after_max_wait_in_half_open' => 'OPEN',
        'wait_interval_multiplier' => 1.0,
        'max_wait_duration_in_open_state' => 0.0,
        'wait_randomization_factor' => 0.0,
        'ramp_duration' => 0.0,
        'ramp_start' => 0.1,
        'config_version' => 0,
    ];

    /** Wire codes of the optional fields 13 and 14 (docs/KEY_SCHEMA.md). */
    private const INITIAL_CODES = ['CLOSED' => 'C', 'FORCED_OPEN' => 'F', 'METRICS_ONLY' => 'M', 'DISABLED' => 'D'];
    private const AFTER_HALF_OPEN_CODES = ['OPEN' => 'O', 'CLOSED' => 'C'];

    /** Client-side options (classification and Redis error policy), PHP names = Python names. */
    public const CLIENT_DEFAULTS = [
        'record_exceptions' => [],
        'ignore_exceptions' => [],
        'record_predicate' => null,
        'ignore_predicate' => null,
        'on_redis_error' => 'fail_open',
    ];

    public readonly float $failureRateThreshold;
    public readonly float $slowCallRateThreshold;
    public readonly float $slowCallDuration;
    public readonly string $slidingWindowType;
    public readonly int $slidingWindowSize;
    public readonly int $minimumNumberOfCalls;
    public readonly float $waitDurationInOpenState;
    public readonly int $permittedCallsInHalfOpen;
    public readonly float $maxWaitInHalfOpen;
    public readonly float $halfOpenLease;
    public readonly float $keyTtl;
    public readonly string $initialState;
    public readonly string $transitionAfterMaxWaitInHalfOpen;
    public readonly float $waitIntervalMultiplier;
    public readonly float $maxWaitDurationInOpenState;
    public readonly float $waitRandomizationFactor;
    /** Slow start after HALF_OPEN -> CLOSED (seconds; 0 = off), from the share ramp_start. */
    public readonly float $rampDuration;
    public readonly float $rampStart;
    /** Orders configs in a rollout (wire field 22; docs/OPERATIONS.md, "Changing a breaker's config"). */
    public readonly int $configVersion;
    /** @var list<class-string<\Throwable>> */
    public readonly array $recordExceptions;
    /** @var list<class-string<\Throwable>> */
    public readonly array $ignoreExceptions;
    /** @var (callable(\Throwable): bool)|null */
    public readonly mixed $recordPredicate;
    /** @var (callable(\Throwable): bool)|null */
    public readonly mixed $ignorePredicate;
    public readonly string $onRedisError;

    /** @param array<string, mixed> $options Python BreakerConfig field names */
    public function __construct(array $options = [])
    {
        Options::refuseUnknown($options, 'breaker', self::DEFAULTS, self::CLIENT_DEFAULTS);
        $o = $options + self::DEFAULTS + self::CLIENT_DEFAULTS;
        $this->failureRateThreshold = self::percent($o['failure_rate_threshold'], 'failure_rate_threshold');
        $this->slowCallRateThreshold = self::percent($o['slow_call_rate_threshold'], 'slow_call_rate_threshold');
        $type = $o['sliding_window_type'];
        $key = is_string($type) ? strtoupper($type) : '';
        $key = ['COUNT' => 'COUNT_BASED', 'TIME' => 'TIME_BASED'][$key] ?? $key;
        if ($key !== 'COUNT_BASED' && $key !== 'TIME_BASED') {
            throw new \InvalidArgumentException('sliding_window_type must be COUNT_BASED or TIME_BASED, got ' . self::show($type));
        }
        $this->slidingWindowType = $key;
        $top = $key === 'COUNT_BASED' ? self::MAX_COUNT_WINDOW : self::MAX_TIME_WINDOW;
        $this->slidingWindowSize = self::integer($o['sliding_window_size'], 'sliding_window_size', 1, $top);
        $this->minimumNumberOfCalls = self::integer($o['minimum_number_of_calls'], 'minimum_number_of_calls', 1, 1000000000);
        $this->permittedCallsInHalfOpen = self::integer($o['permitted_calls_in_half_open'], 'permitted_calls_in_half_open', 1, 10000);
        $this->slowCallDuration = self::seconds($o['slow_call_duration'], 'slow_call_duration');
        $this->waitDurationInOpenState = self::seconds($o['wait_duration_in_open_state'], 'wait_duration_in_open_state');
        $this->maxWaitInHalfOpen = self::seconds($o['max_wait_in_half_open'], 'max_wait_in_half_open');
        $this->halfOpenLease = self::seconds($o['half_open_lease'], 'half_open_lease');
        $this->keyTtl = self::seconds($o['key_ttl'], 'key_ttl');
        foreach (['slow_call_duration' => $this->slowCallDuration, 'half_open_lease' => $this->halfOpenLease] as $field => $value) {
            if ($value <= 0) {
                throw new \InvalidArgumentException("{$field} must be > 0 seconds, got " . self::show($value));
            }
        }
        if ($this->waitDurationInOpenState < 0.001) {
            throw new \InvalidArgumentException('wait_duration_in_open_state must be >= 0.001 seconds, got ' . self::show($this->waitDurationInOpenState));
        }
        $floor = max(
            $this->waitDurationInOpenState,
            $this->maxWaitInHalfOpen,
            $this->halfOpenLease,
            $key === 'TIME_BASED' ? (float) $this->slidingWindowSize : 0.0,
        );
        if ($this->keyTtl < $floor) {
            throw new \InvalidArgumentException("key_ttl must be >= {$floor} seconds (the longest wait, lease or time window), got " . self::show($this->keyTtl));
        }
        foreach (['initial_state' => self::INITIAL_CODES, 'transition_after_max_wait_in_half_open' => self::AFTER_HALF_OPEN_CODES] as $field => $codes) {
            $value = is_string($o[$field]) ? strtoupper($o[$field]) : '';
            if (!isset($codes[$value])) {
                throw new \InvalidArgumentException("{$field} must be one of " . implode(', ', array_keys($codes)) . ', got ' . self::show($o[$field]));
            }
            $o[$field] = $value;
        }
        $this->initialState = $o['initial_state'];
        $this->transitionAfterMaxWaitInHalfOpen = $o['transition_after_max_wait_in_half_open'];
        foreach (['wait_interval_multiplier' => [1.0, 1000.0], 'wait_randomization_factor' => [0.0, 1.0]] as $field => [$low, $high]) {
            if (!is_int($o[$field]) && !is_float($o[$field]) || $o[$field] < $low || $o[$field] > $high) {
                throw new \InvalidArgumentException("{$field} must be a number in [{$low}, {$high}], got " . self::show($o[$field]));
            }
        }
        $this->waitIntervalMultiplier = (float) $o['wait_interval_multiplier'];
        $this->waitRandomizationFactor = (float) $o['wait_randomization_factor'];
        $cap = self::seconds($o['max_wait_duration_in_open_state'], 'max_wait_duration_in_open_state');
        if ($cap > 0 && ($cap < $this->waitDurationInOpenState || $cap > $this->keyTtl)) {
            throw new \InvalidArgumentException('max_wait_duration_in_open_state must be 0 (the key TTL) or between wait_duration_in_open_state and key_ttl, got ' . self::show($cap));
        }
        $this->maxWaitDurationInOpenState = $cap;
        $this->rampDuration = self::seconds($o['ramp_duration'], 'ramp_duration');
        $ramp = $o['ramp_start'];
        if (!is_int($ramp) && !is_float($ramp) || !($ramp > 0 && $ramp <= 1)) {
            throw new \InvalidArgumentException('ramp_start must be a number in (0, 1], got ' . self::show($ramp));
        }
        $this->rampStart = (float) $ramp;
        $version = $o['config_version'];
        if (!is_int($version) || $version < 0) {
            throw new \InvalidArgumentException('config_version must be an integer >= 0, got ' . self::show($version));
        }
        $this->configVersion = $version;
        $this->recordExceptions = self::classes($o['record_exceptions'], 'record_exceptions');
        $this->ignoreExceptions = self::classes($o['ignore_exceptions'], 'ignore_exceptions');
        foreach (['record_predicate', 'ignore_predicate'] as $field) {
            if ($o[$field] !== null && !is_callable($o[$field])) {
                throw new \InvalidArgumentException("{$field} must be callable or null");
            }
        }
        $this->recordPredicate = $o['record_predicate'];
        $this->ignorePredicate = $o['ignore_predicate'];
        if (!in_array($o['on_redis_error'], ['fail_open', 'fail_closed'], true)) {
            throw new \InvalidArgumentException("on_redis_error must be 'fail_open' or 'fail_closed', got " . self::show($o['on_redis_error']));
        }
        $this->onRedisError = $o['on_redis_error'];
    }

    /** Resilience4j caps the minimum at the window size for count windows. */
    public function effectiveMinimumCalls(): int
    {
        if ($this->slidingWindowType === 'COUNT_BASED') {
            return min($this->minimumNumberOfCalls, $this->slidingWindowSize);
        }
        return $this->minimumNumberOfCalls;
    }

    /** The semicolon-separated form the scripts parse; byte-equal to Python's to_wire(). */
    public function toWire(): string
    {
        // optional fields up to the last non-default one, as Python writes them
        $extra = [
            self::INITIAL_CODES[$this->initialState],
            self::AFTER_HALF_OPEN_CODES[$this->transitionAfterMaxWaitInHalfOpen],
            self::num($this->waitIntervalMultiplier),
            (string) self::toMs($this->maxWaitDurationInOpenState),
            self::num($this->waitRandomizationFactor),
            (string) self::toMs($this->rampDuration),
            self::num($this->rampStart),
            '1',     // min failing workers: the quorum trip is Python's only (PHP sends no worker mark)
            '60000', // quorum window
            (string) $this->configVersion,
        ];
        $defaults = ['C', 'O', '1', '0', '0', '0', '0.1', '1', '60000', '0'];
        while ($extra !== [] && end($extra) === $defaults[count($extra) - 1]) {
            array_pop($extra);
        }
        return implode(';', [
            self::WIRE_VERSION,
            $this->slidingWindowType === 'COUNT_BASED' ? 'C' : 'T',
            (string) $this->slidingWindowSize,
            (string) $this->effectiveMinimumCalls(),
            self::num($this->failureRateThreshold),
            self::num($this->slowCallRateThreshold),
            (string) self::toMs($this->waitDurationInOpenState),
            (string) $this->permittedCallsInHalfOpen,
            (string) self::toMs($this->maxWaitInHalfOpen),
            (string) self::toMs($this->halfOpenLease),
            (string) self::toMs($this->keyTtl),
            (string) self::toMs($this->slowCallDuration),
            ...$extra,
        ]);
    }

    /** Seconds to integer ms like Python's round(): halves go to the even neighbour. */
    public static function toMs(float $seconds): int
    {
        return self::roundHalfEven($seconds * 1000);
    }

    /** Python's round(x) for a float: to the nearest integer, halves to the even one. */
    public static function roundHalfEven(float $x): int
    {
        $low = floor($x);
        $diff = $x - $low; // exact for doubles below 2**52
        if ($diff > 0.5 || ($diff === 0.5 && fmod($low, 2.0) !== 0.0)) {
            $low += 1;
        }
        return (int) $low;
    }

    /** A threshold as Python writes it: "50" when whole, else repr(float) ("33.5", "1e-05"). */
    public static function num(float $value): string
    {
        if (floor($value) === $value && abs($value) < 1e15) {
            return (string) (int) $value;
        }
        return self::pythonRepr($value);
    }

    /** Python's repr() of a finite float: shortest round-trip digits, exponent when < 1e-4 or >= 1e16. */
    public static function pythonRepr(float $value): string
    {
        $old = ini_set('serialize_precision', '-1');
        try {
            $text = var_export($value, true); // shortest round-trip digits, e.g. 1.5E-5, 33.5
        } finally {
            if ($old !== false) {
                ini_set('serialize_precision', $old);
            }
        }
        $sign = '';
        if ($text[0] === '-') {
            $sign = '-';
            $text = substr($text, 1);
        }
        $exp = 0;
        $parts = preg_split('/[eE]/', $text);
        if (count($parts) === 2) {
            $exp = (int) $parts[1];
        }
        [$int, $frac] = array_pad(explode('.', $parts[0]), 2, '');
        $digits = ltrim($int . $frac, '0');
        // value = 0.<digits> * 10**point
        $point = strlen($int) + $exp - (strlen($int . $frac) - strlen(ltrim($int . $frac, '0')));
        $digits = rtrim($digits, '0');
        if ($digits === '') {
            return $sign . '0.0';
        }
        $decimalExp = $point - 1; // scientific exponent of the first digit
        if ($decimalExp < -4 || $decimalExp >= 16) {
            $mantissa = $digits[0] . (strlen($digits) > 1 ? '.' . substr($digits, 1) : '');
            return sprintf('%s%se%s%02d', $sign, $mantissa, $decimalExp < 0 ? '-' : '+', abs($decimalExp));
        }
        if ($point <= 0) {
            return $sign . '0.' . str_repeat('0', -$point) . $digits;
        }
        if ($point >= strlen($digits)) {
            return $sign . $digits . str_repeat('0', $point - strlen($digits)) . '.0';
        }
        return $sign . substr($digits, 0, $point) . '.' . substr($digits, $point);
    }

    private static function show(mixed $value): string
    {
        return var_export($value, true);
    }

    private static function percent(mixed $value, string $field): float
    {
        if (!(is_int($value) || is_float($value)) || !is_finite((float) $value) || $value <= 0 || $value > 100) {
            throw new \InvalidArgumentException("{$field} must be a number in (0, 100], got " . self::show($value));
        }
        return (float) $value;
    }

    private static function integer(mixed $value, string $field, int $low, int $high): int
    {
        if (!is_int($value) || $value < $low || $value > $high) {
            throw new \InvalidArgumentException("{$field} must be an integer in [{$low}, {$high}], got " . self::show($value));
        }
        return $value;
    }

    private static function seconds(mixed $value, string $field): float
    {
        if ($value instanceof \DateInterval) {
            $value = (float) ((new \DateTimeImmutable('@0'))->add($value)->format('U.u'));
        }
        if (!(is_int($value) || is_float($value)) || !is_finite((float) $value) || $value < 0) {
            throw new \InvalidArgumentException("{$field} must be a finite duration >= 0 seconds, got " . self::show($value));
        }
        return (float) $value;
    }

    /** @return list<class-string<\Throwable>> */
    private static function classes(mixed $value, string $field): array
    {
        $items = is_string($value) ? [$value] : $value;
        if (!is_array($items)) {
            throw new \InvalidArgumentException("{$field} must be a list of exception class names");
        }
        foreach ($items as $item) {
            if (!is_string($item) || !(class_exists($item) || interface_exists($item)) || !is_a($item, \Throwable::class, true)) {
                throw new \InvalidArgumentException("{$field} must hold Throwable class names, got " . self::show($item));
            }
        }
        return array_values($items);
    }
}
