<?php

// distbreaker for Laravel: `php artisan vendor:publish --tag=distbreaker-config`
// copies this file to config/distbreaker.php. Option names and defaults are
// Python distbreaker's (Resilience4j's), so PHP and Python workers configured
// alike share breakers without config drift. Durations: seconds, or strings
// such as '500ms', '30s', '5m'. Closures (predicates) cannot live in a cached
// config: add them in a service provider with
// Distbreaker::configure('breaker', 'payments', ['ignore_predicate' => fn ($e) => ...]).

return [

    // distbreaker's own connection. Not one of Laravel's Redis connections:
    // their key prefix would rename distbreaker's keys and split the fleet.
    // Connected on first use; while Redis is unreachable each component's
    // on_redis_error applies (fail_open: calls run, unrecorded).
    'redis' => [
        'url' => env('DISTBREAKER_REDIS_URL'),
        'host' => env('DISTBREAKER_REDIS_HOST', env('REDIS_HOST', '127.0.0.1')),
        'port' => env('DISTBREAKER_REDIS_PORT', env('REDIS_PORT', 6379)),
        'username' => env('DISTBREAKER_REDIS_USERNAME', env('REDIS_USERNAME')),
        'password' => env('DISTBREAKER_REDIS_PASSWORD', env('REDIS_PASSWORD')),
        'database' => env('DISTBREAKER_REDIS_DB', 0),
        'timeout' => 0.25,        // connect, seconds: the breaker must not become the outage
        'read_timeout' => 0.25,   // per command, seconds
        'retry_interval' => 1.0,  // seconds without a new connect attempt after a failure
        'persistent' => env('DISTBREAKER_REDIS_PERSISTENT', false),
    ],

    // The key prefix; the same as the Python workers' (default 'distbreaker').
    'prefix' => env('DISTBREAKER_PREFIX', 'distbreaker'),

    // Circuit breakers: `configs.default` applies to every instance without a
    // base_config, and to names not listed here.
    'breakers' => [
        'configs' => [
            'default' => [
                'failure_rate_threshold' => 50,
                'slow_call_rate_threshold' => 100,
                'slow_call_duration' => '60s',
                'sliding_window_type' => 'COUNT_BASED',
                'sliding_window_size' => 100,
                'minimum_number_of_calls' => 100,
                'wait_duration_in_open_state' => '60s',
                'permitted_calls_in_half_open' => 10,
                'on_redis_error' => env('DISTBREAKER_ON_REDIS_ERROR', 'fail_open'),  // or fail_closed
            ],
        ],
        'instances' => [
            // 'payments' => ['minimum_number_of_calls' => 20, 'wait_duration_in_open_state' => '30s'],
        ],
    ],

    // Fleet-wide bulkheads (at most max_concurrent_calls at once, PHP and Python together).
    'bulkheads' => [
        'configs' => [
            'default' => ['max_concurrent_calls' => 25, 'max_wait_duration' => 0, 'lease' => '30s'],
        ],
        'instances' => [],
    ],

    // Fleet-wide retry budgets (Finagle): deposit once per request, withdraw once per retry.
    'budgets' => [
        'configs' => [
            'default' => ['percent_can_retry' => 0.2, 'min_retries_per_sec' => 10, 'ttl' => '10s'],
        ],
        'instances' => [],
    ],

    // Fleet-wide rate limiters (PHP and Python share each bucket), e.g. LLM tokens per minute:
    // 'llm' => ['limit_for_period' => 90000, 'limit_refresh_period' => '1m', 'timeout_duration' => '10s'].
    'rate_limiters' => [
        'configs' => [
            'default' => ['limit_for_period' => 50, 'limit_refresh_period' => '500ms', 'timeout_duration' => '5s'],
        ],
        'instances' => [],
    ],

];
