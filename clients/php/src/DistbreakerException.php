<?php

declare(strict_types=1);

namespace Distbreaker;

/** Base class of every exception the client throws on its own account. */
class DistbreakerException extends \RuntimeException
{
}
