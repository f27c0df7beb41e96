<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * Throw it from a protected call when the dependency answered "overloaded" (an HTTP
 * 429, or a 503 with Retry-After): an adaptive bulkhead cuts its limit and pauses
 * increases for $retryAfter seconds; anything else treats it as a failure.
 * Python's distbreaker.Overloaded.
 */
class Overloaded extends DistbreakerException
{
    public readonly float $retryAfter;

    public function __construct(string $message = 'the dependency is overloaded', float $retryAfter = 0.0, ?\Throwable $previous = null)
    {
        parent::__construct($message, 0, $previous);
        $this->retryAfter = max(0.0, $retryAfter);
    }
}
