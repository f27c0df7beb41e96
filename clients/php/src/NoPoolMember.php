<?php

declare(strict_types=1);

namespace Distbreaker;

/** Pool::pick() found no member to choose (none in Redis nor in the static members). */
final class NoPoolMember extends DistbreakerException
{
    public function __construct(public readonly string $poolName)
    {
        parent::__construct("pool '{$poolName}' has no member to pick");
    }
}
