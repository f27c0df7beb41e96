<?php

namespace App\Providers;

use Illuminate\Support\ServiceProvider;

class AppServiceProvider extends ServiceProvider
{
    public function boot(): void
    {
        // A predicate cannot live in the (cacheable) config file: give it here,
        // through the auto-discovered facade alias, before the breaker's first use.
        \Distbreaker::configure('breaker', 'payments', [
            'ignore_predicate' => fn (\Throwable $e) => $e instanceof \InvalidArgumentException,
        ]);
    }
}
