<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * Permission to run one call. $token is the half-open probe lease ('' outside
 * HALF_OPEN); hand the permit back to record() when the call ends.
 */
final class Permit
{
    public function __construct(public readonly string $token = '')
    {
    }
}
