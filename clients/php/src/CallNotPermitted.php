<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * The breaker rejected the call without running it.
 *
 * $retryAfter is the number of seconds until a probe may be tried (0 when
 * unknown or not applicable, e.g. FORCED_OPEN or a fail-closed Redis outage).
 * $reason and $actor say why the breaker is in this state and who put it there,
 * as in Python: the transition's reason ("failure rate 100% >= 50%", an operator's
 * "maintenance") and the operator ("alice@host"; empty for the breaker's own moves).
 */
class CallNotPermitted extends DistbreakerException
{
    public readonly float $retryAfter;

    public function __construct(
        public readonly string $name,
        public readonly string $state,
        float $retryAfter = 0.0,
        public readonly string $reason = '',
        ?\Throwable $previous = null,
        public readonly string $actor = '',
    ) {
        $this->retryAfter = max(0.0, $retryAfter);
        $by = $actor !== '' ? ", by {$actor}" : '';
        $detail = $reason !== '' ? " ({$reason}{$by})" : '';
        parent::__construct(
            sprintf("circuit breaker '%s' is %s%s; retry after %.3fs", $name, $state, $detail, $this->retryAfter),
            0,
            $previous,
        );
    }
}
