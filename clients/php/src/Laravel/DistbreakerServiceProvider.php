<?php

declare(strict_types=1);

namespace Distbreaker\Laravel;

use Distbreaker\Connection;
use Distbreaker\Registry;
use Illuminate\Contracts\Foundation\Application;
use Illuminate\Support\ServiceProvider;

/**
 * Laravel service provider (auto-discovered through composer.json's
 * extra.laravel): config/distbreaker.php merged under `distbreaker`, one lazy
 * Connection and one Registry per application, bound as `distbreaker` (the
 * facade's accessor) and by class.
 *
 * The connection is distbreaker's own, not one of Laravel's Redis
 * connections: those add a key prefix (laravel_database_) that would rename
 * distbreaker's keys and split PHP from Python. It connects on first use, so
 * Redis being down while the application boots is handled by each component's
 * on_redis_error (fail_open by default), like any other outage.
 */
final class DistbreakerServiceProvider extends ServiceProvider
{
    public const CONFIG = __DIR__ . '/../../config/distbreaker.php';

    public function register(): void
    {
        $this->mergeConfigFrom(self::CONFIG, 'distbreaker');

        $this->app->singleton(Connection::class, static function (Application $app): Connection {
            return Connection::fromConfig((array) $app->make('config')->get('distbreaker.redis', []));
        });
        $this->app->alias(Connection::class, 'distbreaker.connection');

        $this->app->singleton(Registry::class, static function (Application $app): Registry {
            return new Registry($app->make(Connection::class), (array) $app->make('config')->get('distbreaker', []));
        });
        $this->app->alias(Registry::class, 'distbreaker');
    }

    public function boot(): void
    {
        if ($this->app->runningInConsole()) {
            $this->publishes([self::CONFIG => $this->app->configPath('distbreaker.php')], 'distbreaker-config');
        }
    }

    /** @return list<string> */
    public function provides(): array
    {
        return [Connection::class, 'distbreaker.connection', Registry::class, 'distbreaker'];
    }
}
