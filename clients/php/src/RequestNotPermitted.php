<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * The rate limiter gave no permit within timeout_duration; the call did not run.
 * $retryAfter: the seconds after which that many permits would have been granted
 * (0 when unknown: more permits than the burst, or Redis unavailable under
 * fail_closed); $reason: what refused.
 */
final class RequestNotPermitted extends DistbreakerException
{
    public function __construct(
        public readonly string $name,
        public readonly int $permits = 1,
        public readonly float $retryAfter = 0.0,
        public readonly string $reason = 'fleet-wide limit',
    ) {
        parent::__construct(sprintf(
            "rate limiter '%s' refused %d permit(s) (%s); retry after %.3fs",
            $name,
            $permits,
            $reason,
            max(0.0, $retryAfter),
        ));
    }
}
