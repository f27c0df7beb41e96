<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * The breaker rejected the call without running it.
 *
 * $retryAfter is the number of seconds until a probe may be tried (0 when
 * unknown or not applicable, e.g. FORCED_OPEN or a fail-closed Redis outage).
 */
final class CallNotPermitted extends DistbreakerException
{
    public readonly float $retryAfter;

    public function __construct(
        public readonly string $name,
        public readonly string $state,
        float $retryAfter = 0.0,
        public readonly string $reason = '',
        ?\Throwable $previous = null,
    ) {
        $this->retryAfter = max(0.0, $retryAfter);
        $detail = $reason !== '' ? " ({$reason})" : '';
        parent::__construct(
            sprintf("circuit breaker '%s' is %s%s; retry after %.3fs", $name, $state, $detail, $this->retryAfter),
            0,
            $previous,
        );
    }
}
