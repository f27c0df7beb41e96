<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * A fault an operator injected (`distbreaker inject NAME --error 503`), thrown in place
 * of the protected call and recorded by the breaker as a failure; $statusCode is the
 * injected HTTP status. `instanceof InjectedFault` tells it from a real failure.
 */
final class InjectedFault extends DistbreakerException
{
    public function __construct(
        public readonly string $name,
        public readonly int $statusCode = 503,
        public readonly string $reason = '',
        public readonly string $actor = '',
    ) {
        $by = $actor !== '' ? ", by {$actor}" : '';
        $why = ($reason !== '' || $by !== '') ? " ({$reason}{$by})" : '';
        parent::__construct("injected fault on '{$name}': HTTP {$statusCode}{$why}");
    }
}
