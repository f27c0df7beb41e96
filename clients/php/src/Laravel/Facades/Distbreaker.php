<?php

declare(strict_types=1);

namespace Distbreaker\Laravel\Facades;

use Illuminate\Support\Facades\Facade;

/**
 * `Distbreaker::breaker('payments')->call(...)`: the application's
 * Distbreaker\Registry (config/distbreaker.php).
 *
 * @method static \Distbreaker\CircuitBreaker breaker(string $name)
 * @method static \Distbreaker\Bulkhead bulkhead(string $name)
 * @method static \Distbreaker\RetryBudget budget(string $name)
 * @method static void configure(string $kind, string $name, array $options)
 * @method static array options(string $kind, string $name)
 * @method static \Distbreaker\Connection connection()
 *
 * @see \Distbreaker\Registry
 */
final class Distbreaker extends Facade
{
    protected static function getFacadeAccessor(): string
    {
        return 'distbreaker';
    }
}
