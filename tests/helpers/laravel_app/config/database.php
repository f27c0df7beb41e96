<?php

return [
    'default' => 'sqlite',
    'connections' => ['sqlite' => ['driver' => 'sqlite', 'database' => ':memory:', 'prefix' => '']],
    'migrations' => 'migrations',
    // Laravel's own Redis connections (the app's cache, queues...); distbreaker
    // does not use them: it has its own connection (config/distbreaker.php).
    'redis' => [
        'client' => 'phpredis',
        'options' => ['prefix' => 'laravel_database_'],
        'default' => ['host' => env('REDIS_HOST', '127.0.0.1'), 'port' => env('REDIS_PORT', 6379), 'database' => 0],
    ],
];
