<?php

declare(strict_types=1);

namespace Distbreaker;

/** The option checks every component's constructor shares. */
final class Options
{
    /**
     * Refuse options no component of this kind knows, all of them named at once.
     *
     * @param array<string, mixed> $given
     * @param array<string, mixed> ...$known the known options' defaults
     */
    public static function refuseUnknown(array $given, string $what, array ...$known): void
    {
        $unknown = array_diff(array_keys($given), ...array_map('array_keys', $known));
        if ($unknown !== []) {
            sort($unknown);
            throw new \InvalidArgumentException("unknown {$what} option(s): " . implode(', ', $unknown));
        }
    }
}
