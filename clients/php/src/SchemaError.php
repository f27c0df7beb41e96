<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * A key holds data this client did not write: another schema version, a wrong
 * Redis type, or garbage. Raised instead of misreading it (DISTBREAKER_SCHEMA).
 */
final class SchemaError extends DistbreakerException
{
    public function __construct(string $message, public readonly string $key = '', ?\Throwable $previous = null)
    {
        parent::__construct($message, 0, $previous);
    }
}
