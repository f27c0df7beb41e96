<?php

declare(strict_types=1);

namespace Distbreaker;

/** The bulkhead had no free permit (within max_wait_duration); the call did not run. */
final class BulkheadFull extends DistbreakerException
{
    public function __construct(
        public readonly string $name,
        public readonly int $limit,
        public readonly int $inUse,
        public readonly float $waited = 0.0,
    ) {
        $detail = $waited > 0 ? sprintf(' after waiting %.3fs', $waited) : '';
        parent::__construct(sprintf(
            "bulkhead '%s' is full (%d/%d permits in use, fleet-wide limit)%s",
            $name,
            $inUse,
            $limit,
            $detail,
        ));
    }
}
