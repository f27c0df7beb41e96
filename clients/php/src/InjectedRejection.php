<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * A rejection an operator injected (`distbreaker inject NAME --reject`): a
 * CallNotPermitted (every fallback runs) while the fleet's breaker state is untouched.
 */
final class InjectedRejection extends CallNotPermitted
{
}
