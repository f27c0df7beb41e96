<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * A fleet-wide adaptive bulkhead limit: Python's distbreaker.AdaptiveLimit with the
 * same option names, defaults and validation, and the same ARGV[7] string, so PHP and
 * Python workers move one limit together (docs/ADAPTIVE.md has the algorithm).
 */
final class AdaptiveLimit
{
    public const DEFAULTS = [
        'min_limit' => 1,
        'max_limit' => 200,
        'initial_limit' => null,   // min_limit x 4, within the bounds
        'backoff_ratio' => 0.9,
        'tolerance' => 1.5,
        'smoothing' => 0.5,
        'latency_target' => null,  // seconds: the limit is cut whenever latency is above it
        'probe_interval' => 10.0,  // seconds between re-measures of the no-load latency
        'window' => 0.2,           // seconds (and 24 successes) per fleet-wide window
    ];
    private const MILLION = 1000000;

    public readonly int $minLimit;
    public readonly int $maxLimit;
    public readonly int $initialLimit;
    public readonly float $backoffRatio;
    public readonly float $tolerance;
    public readonly float $smoothing;
    public readonly ?float $latencyTarget;
    public readonly float $probeInterval;
    public readonly float $window;

    /** @param array<string, mixed> $options Python AdaptiveLimit field names */
    public function __construct(array $options = [])
    {
        Options::refuseUnknown($options, 'adaptive', self::DEFAULTS);
        $o = $options + self::DEFAULTS;
        $this->minLimit = self::integer($o['min_limit'], 'min_limit', 1, self::MILLION);
        $this->maxLimit = self::integer($o['max_limit'], 'max_limit', $this->minLimit, self::MILLION);
        $initial = $o['initial_limit'] ?? min($this->maxLimit, max($this->minLimit, 4 * $this->minLimit));
        $this->initialLimit = self::integer($initial, 'initial_limit', $this->minLimit, $this->maxLimit);
        $ranges = ['backoff_ratio' => [0.1, 0.999], 'tolerance' => [1.0, 10.0], 'smoothing' => [0.001, 1.0],
            'probe_interval' => [0.1, 86400.0], 'window' => [0.01, 60.0]];
        $numbers = [];
        foreach ($ranges as $field => [$low, $high]) {
            $v = $o[$field];
            if (!(is_int($v) || is_float($v)) || $v < $low || $v > $high) {
                throw new \InvalidArgumentException("{$field} must be a number in [{$low}, {$high}], got " . var_export($v, true));
            }
            $numbers[$field] = (float) $v;
        }
        $this->backoffRatio = $numbers['backoff_ratio'];
        $this->tolerance = $numbers['tolerance'];
        $this->smoothing = $numbers['smoothing'];
        $this->probeInterval = $numbers['probe_interval'];
        $this->window = $numbers['window'];
        $target = $o['latency_target'];
        if ($target !== null && (!(is_int($target) || is_float($target)) || $target < 0.001 || $target > 3600)) {
            throw new \InvalidArgumentException('latency_target must be null or seconds in [0.001, 3600], got ' . var_export($target, true));
        }
        $this->latencyTarget = $target === null ? null : (float) $target;
    }

    /** ARGV[7] of the bulkhead script: "min,max,initial,backoff,tolerance,smoothing,target_ms,probe_ms,window_ms"
     * (backoff, tolerance, smoothing in millionths; target 0 = none). */
    public function wire(): string
    {
        return implode(',', [
            $this->minLimit, $this->maxLimit, $this->initialLimit,
            BreakerConfig::roundHalfEven($this->backoffRatio * self::MILLION),
            BreakerConfig::roundHalfEven($this->tolerance * self::MILLION),
            BreakerConfig::roundHalfEven($this->smoothing * self::MILLION),
            $this->latencyTarget === null ? 0 : max(1, BreakerConfig::roundHalfEven($this->latencyTarget * 1000)),
            max(1, BreakerConfig::roundHalfEven($this->probeInterval * 1000)),
            max(1, BreakerConfig::roundHalfEven($this->window * 1000)),
        ]);
    }

    private static function integer(mixed $value, string $field, int $low, int $high): int
    {
        if (!is_int($value)) {
            throw new \InvalidArgumentException("{$field} must be an integer in [{$low}, {$high}], got " . var_export($value, true));
        }
        if ($value < $low || $value > $high) {
            throw new \InvalidArgumentException("{$field} must be in [{$low}, {$high}], got " . var_export($value, true));
        }
        return $value;
    }
}
