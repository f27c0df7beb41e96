<?php

declare(strict_types=1);

namespace Distbreaker;

/** The fleet-wide retry budget had no retry left: the failure is final. */
final class RetryBudgetExhausted extends DistbreakerException
{
    public function __construct(
        public readonly string $name,
        public readonly int $balance = 0,
        public readonly int $deposits = 0,
        public readonly int $withdrawals = 0,
    ) {
        parent::__construct(sprintf(
            "retry budget '%s' is exhausted (balance %d, %d requests and %d retries in the window)",
            $name,
            $balance,
            $deposits,
            $withdrawals,
        ));
    }
}
