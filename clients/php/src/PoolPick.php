<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * One member chosen by Pool::pick(), to record once with Pool::record() (or give back
 * with Pool::release()). Inside Pool::call() the callable may set $status (and
 * $retryAfter) or $outcome to say how the call went without throwing.
 */
final class PoolPick
{
    public bool $recorded = false;
    public ?int $status = null;
    public float|int|string|null $retryAfter = null;
    public ?string $outcome = null;
    /** microtime(true) of the pick: the recorded duration runs from here */
    public readonly float $started;

    /**
     * @param string $mode 'normal', 'panic' (too few healthy members: every member was a
     *                     candidate) or 'probe' (a member back from ejection)
     * @param string $source 'redis', or 'local' while Redis is unreachable (no lease)
     */
    public function __construct(public readonly string $member, public readonly string $token, public readonly string $mode = 'normal', public readonly string $source = 'redis')
    {
        $this->started = microtime(true);
    }
}
