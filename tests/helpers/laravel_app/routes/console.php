<?php

use Distbreaker\BulkheadFull;
use Distbreaker\CallNotPermitted;
use Distbreaker\Laravel\Facades\Distbreaker;
use Illuminate\Support\Facades\Artisan;

// A queued job's view of the package: each command prints one JSON line.

Artisan::command('distbreaker:charge {name} {--fail} {--invalid}', function (string $name) {
    $breaker = Distbreaker::breaker($name);
    try {
        $out = $breaker->call(function () {
            if ($this->option('invalid')) {
                throw new InvalidArgumentException('bad order');   // a client error: ignored by the predicate
            }
            if ($this->option('fail')) {
                throw new RuntimeException('gateway down');
            }
            return ['outcome' => 'ran'];
        });
    } catch (CallNotPermitted $e) {
        $out = ['outcome' => 'rejected', 'state' => $e->state, 'retry_after' => $e->retryAfter];
    } catch (Throwable $e) {
        $out = ['outcome' => 'failed', 'error' => get_class($e), 'counted' => $breaker->outcome($e)];
    }
    $this->line(json_encode($out));
});

Artisan::command('distbreaker:options {kind} {name}', function (string $kind, string $name) {
    $options = Distbreaker::options($kind, $name);
    $this->line(json_encode(array_map(fn ($v) => $v instanceof Closure ? 'closure' : $v, $options)));
});

Artisan::command('distbreaker:guarded {name}', function (string $name) {
    $budget = Distbreaker::budget($name);
    $out = ['deposit' => $budget->deposit()];
    try {
        $out['bulkhead'] = Distbreaker::bulkhead($name)->call(fn () => 'ran');
    } catch (BulkheadFull $e) {
        $out['bulkhead'] = 'full';
    }
    $out['retry_allowed'] = $budget->tryWithdraw();
    $out['connected'] = Distbreaker::connection()->isConnected();
    $out['same_instance'] = Distbreaker::budget($name) === $budget && app('distbreaker') === Distbreaker::getFacadeRoot();
    $this->line(json_encode($out));
});
