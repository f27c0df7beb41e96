<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * One fleet-wide bulkhead permit: $token is the lease holder id in Redis
 * ('' when Redis was unreachable and the call ran without one).
 */
final class BulkheadPermit
{
    public bool $released = false;
    /** True when a renewal or the release found the lease gone (it had expired). */
    public bool $lost = false;

    /** @param float $acquiredAt when the granting acquire was sent (monotonic seconds): an adaptive limit learns the call's latency from it */
    public function __construct(public readonly string $token, public readonly float $acquiredAt = 0.0)
    {
    }
}
