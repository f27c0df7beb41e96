<?php

declare(strict_types=1);

// A PHP worker driven by tests/interop/test_php.py: one JSON job in argv[1],
// one JSON result on stdout. Each action is what a PHP-FPM request would do.

require dirname(__DIR__) . '/src/autoload.php';

use Distbreaker\CallNotPermitted;
use Distbreaker\CircuitBreaker;
use Distbreaker\SchemaError;

$job = json_decode($argv[1] ?? '{}', true, 512, JSON_THROW_ON_ERROR);
$redis = new Redis();
$redis->connect($job['host'] ?? '127.0.0.1', (int) ($job['port'] ?? 6379), 2.0);
$config = $job['config'] ?? [];

/** Block until the test releases every worker at once (a Redis list used as a start gate). */
function gate(Redis $redis, array $job): void
{
    if (isset($job['gate'])) {
        $redis->blPop([$job['gate']], 50);  // long: a loaded machine starts workers slowly
    }
}

function rejection(CallNotPermitted $e): array
{
    return ['outcome' => 'rejected', 'state' => $e->state, 'retry_after' => $e->retryAfter, 'class' => get_class($e),
        'reason' => $e->reason, 'actor' => $e->actor, 'message' => $e->getMessage()];
}

$out = [];
switch ($job['action']) {
    case 'wire':
        $out = array_map(static fn (array $c) => (new Distbreaker\BreakerConfig($c))->toWire(), $job['configs']);
        break;

    case 'fingerprint': // the config fingerprint each config's calls send (ARGV[2])
        $out = array_map(static fn (array $c) => CircuitBreaker::configFingerprint((new Distbreaker\BreakerConfig($c))->toWire()), $job['configs']);
        break;

    case 'calls': // n calls that fail (or succeed), through call()
        $breaker = new CircuitBreaker($redis, $job['name'], $config);
        for ($i = 0; $i < $job['n']; $i++) {
            try {
                $breaker->call(static function () use ($redis, $job) {
                    $redis->incr($job['counter']);
                    if ($job['fail']) {
                        throw new RuntimeException('dependency down');
                    }
                    return 'ok';
                });
                $out[] = ['outcome' => 'ok'];
            } catch (CallNotPermitted $e) {
                $out[] = rejection($e);
            } catch (RuntimeException $e) {
                $out[] = ['outcome' => 'failed'];
            }
        }
        break;

    case 'records': // n successes recorded without a permit, each op's decoded reply
        $breaker = new CircuitBreaker($redis, $job['name'], $config);
        $out = ['replies' => []];
        for ($i = 0; $i < $job['n']; $i++) {
            $out['replies'][] = $breaker->execute('record', '', 1, 0, 0, 5);
        }
        $out['metrics'] = $breaker->metrics();
        break;

    case 'load_error': // a lua_dir holding something that is not the EVAL form
        try {
            new CircuitBreaker($redis, $job['name'], ['lua_dir' => $job['lua_dir']]);
            $out = ['outcome' => 'loaded'];
        } catch (RuntimeException $e) {
            $out = ['outcome' => 'refused', 'message' => $e->getMessage()];
        }
        break;

    case 'probe': // wait at the gate, then one call that holds the dependency briefly
        $breaker = new CircuitBreaker($redis, $job['name'], $config);
        gate($redis, $job);
        try {
            $out = ['outcome' => $breaker->call(static function () use ($redis, $job) {
                $redis->incr($job['counter']);
                usleep((int) ($job['hold'] * 1e6));
                return 'ok';
            })];
        } catch (CallNotPermitted $e) {
            $out = rejection($e);
        }
        break;

    case 'faults': // n calls on a breaker allowing fault injection: outcomes counted by kind
        $breaker = new CircuitBreaker($redis, $job['name'], $config + ['allow_fault_injection' => true]);
        $out = ['ok' => 0, 'injected' => 0, 'rejected' => 0, 'status' => null];
        for ($i = 0; $i < $job['n']; $i++) {
            try {
                $breaker->call(static fn () => 'ok');
                $out['ok']++;
            } catch (Distbreaker\InjectedFault $e) {
                $out['injected']++;
                $out['status'] = $e->statusCode;
            } catch (Distbreaker\InjectedRejection $e) {
                $out['rejected']++;
            }
            usleep(5000);
        }
        break;

    case 'fallback':
        $breaker = new CircuitBreaker($redis, $job['name'], $config);
        $out = $breaker->call(
            static fn () => throw new RuntimeException('dependency down'),
            static fn (Throwable $e) => ['status' => 'queued', 'because' => get_class($e)],
        );
        break;

    case 'trip': // an operator action from PHP, with a listener
        $breaker = new CircuitBreaker($redis, $job['name'], $config);
        $seen = [];
        $breaker->onTransition(static function (array $event) use (&$seen) {
            $seen[] = $event;
        });
        $out = ['state' => $breaker->trip($job['reason'], 'php'), 'seen' => $seen];
        break;

    case 'hold': // an operator override that ends by server time, then one call
        $breaker = new CircuitBreaker($redis, $job['name'], $config);
        $state = $breaker->transitionTo($job['state'], $job['reason'], 'php', $job['for'] ?? null, $job['until'] ?? null);
        try {
            $out = ['state' => $state, 'call' => $breaker->call(static fn () => 'ok')];
        } catch (CallNotPermitted $e) {
            $out = ['state' => $state, 'call' => rejection($e)];
        }
        break;

    case 'state':
        $breaker = new CircuitBreaker($redis, $job['name'], $config);
        $out = ['state' => $breaker->state(), 'metrics' => $breaker->metrics()];
        break;

    case 'schema':
        $breaker = new CircuitBreaker($redis, $job['name'], $config);
        try {
            $breaker->acquire();
            $out = ['outcome' => 'permitted'];
        } catch (SchemaError $e) {
            $out = ['outcome' => 'schema_error', 'class' => get_class($e), 'key' => $e->key, 'message' => $e->getMessage()];
        }
        break;

    case 'bulkhead': // wait at the gate, then hold a fleet-wide permit while counting concurrency
        $bulkhead = new Distbreaker\Bulkhead($redis, $job['name'], $config);
        gate($redis, $job);
        try {
            $out = ['outcome' => $bulkhead->call(static function () use ($redis, $job) {
                $now = $redis->incr($job['counter']);
                $redis->eval("local m = tonumber(redis.call('GET', KEYS[2]) or '0') if ARGV[1] + 0 > m then redis.call('SET', KEYS[2], ARGV[1]) end return 1", [$job['counter'], $job['peak'], $now], 2);
                usleep((int) ($job['hold'] * 1e6));
                $redis->decr($job['counter']);
                return 'ok';
            })];
        } catch (Distbreaker\BulkheadFull $e) {
            $out = ['outcome' => 'full', 'in_use' => $e->inUse, 'limit' => $e->limit];
        }
        break;

    case 'ratelimit': // reserve, sleep until due, then log (run_at_ms, permits, ran_ms) atomically
        $limiter = new Distbreaker\RateLimiter($redis, $job['name'], $config);
        $log = <<<'LUA'
local t = redis.call('TIME')
local ran = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('RPUSH', KEYS[1], ARGV[1] .. ',' .. string.format('%d', ran))
LUA;
        gate($redis, $job);
        $permits = (int) ($job['permits'] ?? 1);
        for ($i = 0; $i < ($job['n'] ?? 1); $i++) {
            try {
                $r = $limiter->reserve($permits, $job['key'] ?? null, isset($job['timeout']) ? (float) $job['timeout'] : null);
                if ($r['wait'] > 0) {
                    usleep((int) ceil($r['wait'] * 1000000));
                }
                if (isset($job['log'])) {
                    $redis->eval($log, [$job['log'], "{$r['run_at_ms']},{$permits}"], 1);
                }
                $out[] = ['outcome' => 'ok', 'wait' => $r['wait']];
            } catch (Distbreaker\RequestNotPermitted $e) {
                $out[] = ['outcome' => 'refused', 'retry_after' => $e->retryAfter, 'reason' => $e->reason];
            }
        }
        break;

    case 'ratelimit_admin': // an operator step: change the limit, drain, reset, or read
        $limiter = new Distbreaker\RateLimiter($redis, $job['name'], $config);
        $out = match ($job['op']) {
            'change' => $limiter->changeLimitForPeriod((int) $job['limit']),
            'drain' => $limiter->drain(),
            'reset' => $limiter->resetLimit(),
            default => $limiter->metrics(),
        };
        break;

    case 'budget': // deposit / withdraw on a fleet-wide retry budget
        $budget = new Distbreaker\RetryBudget($redis, $job['name'], $config);
        for ($i = 0; $i < ($job['deposits'] ?? 0); $i++) {
            $budget->deposit();
        }
        $taken = 0;
        for ($i = 0; $i < ($job['withdrawals'] ?? 0); $i++) {
            $taken += $budget->tryWithdraw() ? 1 : 0;
        }
        $out = ['taken' => $taken, 'balance' => $budget->balance()];
        break;

    case 'outage': // Redis unreachable: the documented policy, never a Redis error
        $down = new Redis();
        try {
            $down->connect('127.0.0.1', (int) $job['dead_port'], 0.2);
        } catch (RedisException) {
        }
        foreach (['fail_open', 'fail_closed'] as $policy) {
            $breaker = new CircuitBreaker($down, $job['name'], ['on_redis_error' => $policy]);
            try {
                $out[$policy] = $breaker->call(static fn () => 'ran');
            } catch (CallNotPermitted $e) {
                $out[$policy] = rejection($e);
            }
        }
        break;

    case 'lazy': // components on a Connection that may not reach Redis (yet)
        $connection = new Distbreaker\Connection($job['connection']);
        $breaker = new CircuitBreaker($connection, $job['name'], $config);
        $bulkhead = new Distbreaker\Bulkhead($connection, $job['name'], ['max_concurrent_calls' => 2]);
        $budget = new Distbreaker\RetryBudget($connection, $job['name']);
        $out = ['attempts_after_construct' => $connection->attempts, 'calls' => []];
        for ($i = 0; $i < $job['n']; $i++) {
            if ($i === 1) {
                if (isset($job['ready'])) {
                    $redis->rPush($job['ready'], (string) $connection->attempts);
                }
                gate($redis, $job); // the test may start Redis here
                usleep((int) (($job['pause'] ?? 0) * 1e6));
            }
            try {
                $out['calls'][] = $breaker->call(static fn () => 'ran');
            } catch (CallNotPermitted $e) {
                $out['calls'][] = rejection($e);
            }
        }
        $out['bulkhead'] = $bulkhead->call(static fn () => 'ran');
        $out['deposit'] = $budget->deposit();
        $out['withdraw'] = $budget->tryWithdraw();
        $out['attempts'] = $connection->attempts;
        $out['connected'] = $connection->isConnected();
        break;

    case 'registry': // options a Registry builds from a config, or the error naming what is wrong
        $registry = new Distbreaker\Registry(new Distbreaker\Connection(['port' => (int) $job['port']]), $job['registry']);
        try {
            $method = lcfirst(str_replace('_', '', ucwords($job['kind'], '_'))); // rate_limiter: rateLimiter
            $component = $registry->{$method}($job['name']);
            $out = ['options' => $registry->options($job['kind'], $job['name']), 'class' => get_class($component),
                    'same' => $registry->{$method}($job['name']) === $component];
            if ($component instanceof CircuitBreaker) {
                $out['wire'] = $component->wire;
            }
        } catch (InvalidArgumentException $e) {
            $out = ['error' => $e->getMessage()];
        }
        break;

    case 'adaptive_wire': // ARGV[7] of each adaptive config, and the share of each priority
        $out = ['wires' => [], 'shares' => []];
        foreach ($job['adaptive'] as $c) {
            try {
                $out['wires'][] = (new Distbreaker\AdaptiveLimit($c))->wire();
            } catch (InvalidArgumentException $e) {
                $out['wires'][] = ['error' => $e->getMessage()];
            }
        }
        foreach ($job['shares'] as [$options, $priority]) {
            $out['shares'][] = (new Distbreaker\Bulkhead($redis, 'shares', $options))->share($priority);
        }
        break;

    case 'adaptive': // steps on an adaptive bulkhead: calls that succeed, fail or answer 429; held permits
        $bulkhead = new Distbreaker\Bulkhead($redis, $job['name'], $config);
        $held = [];
        $out = ['steps' => []];
        foreach ($job['steps'] as $step) {
            $priority = $step['priority'] ?? null;
            try {
                if ($step['op'] === 'hold') {
                    $held[] = $bulkhead->acquire($priority);
                    $out['steps'][] = 'held';
                } elseif ($step['op'] === 'restart') {
                    $bulkhead->restartLimit();
                    $out['steps'][] = 'restarted';
                } else {
                    $bulkhead->call(static function () use ($step) {
                        usleep((int) (($step['hold'] ?? 0) * 1e6));
                        return match ($step['op']) {
                            'ok' => 'ok',
                            'fail' => throw new RuntimeException('dependency down'),
                            '429' => throw new Distbreaker\Overloaded('slow down', (float) ($step['retry_after'] ?? 0)),
                        };
                    }, null, $priority);
                    $out['steps'][] = 'ok';
                }
            } catch (Distbreaker\BulkheadFull $e) {
                $out['steps'][] = ['full' => $e->limit, 'in_use' => $e->inUse];
            } catch (RuntimeException $e) {
                $out['steps'][] = $e instanceof Distbreaker\Overloaded ? '429' : 'failed';
            }
        }
        $out['metrics'] = $bulkhead->metrics();
        foreach ($held as $permit) { // given back without an outcome: the limit stays put
            $bulkhead->release($permit, new Distbreaker\BulkheadFull($job['name'], 0, 0));
        }
        break;

    case 'pool': // picks (a step may avoid members), each recorded with the step's status or outcome
        $pool = new Distbreaker\Pool($redis, $job['name'], $config);
        $out = ['picks' => [], 'events' => [], 'sources' => []];
        foreach ($job['steps'] as $step) {
            $pick = $pool->pick($step['key'] ?? null, $step['avoid'] ?? []);
            if ($step['throw'] ?? false) {
                try {
                    $pool->call(static function () { throw new RuntimeException('upstream failed'); });
                } catch (RuntimeException $e) {
                    $out['thrown'][] = $e->getMessage();
                }
                $pool->release($pick);
                continue;
            }
            $change = $pool->record($pick, $step['status'] ?? null, null, $step['outcome'] ?? null, $step['retry_after'] ?? null);
            $out['picks'][] = $pick->member;
            $out['sources'][] = $pick->source;
            $out['events'][] = $change === null ? null : $change['event'];
        }
        $out['status'] = $job['dead_port'] ?? false ? [] : $pool->status();
        break;

    case 'pool_wire': // the config wire string of each config (compared with Python's PoolConfig.wire)
        $out = array_map(static fn (array $c) => (new Distbreaker\Pool($redis, $job['name'], $c))->wire, $job['configs']);
        break;

    case 'pool_outage': // Redis unreachable: picks are local (static members), outcomes dropped
        $down = new Redis();
        try {
            $down->connect('127.0.0.1', (int) $job['dead_port'], 0.2);
        } catch (RedisException) {
        }
        $pool = new Distbreaker\Pool($down, $job['name'], $config);
        $out = ['picks' => [], 'records' => []];
        for ($i = 0; $i < ($job['n'] ?? 5); $i++) {
            $pick = $pool->pick();
            $out['picks'][] = [$pick->member, $pick->source];
            $out['records'][] = $pool->record($pick, 503);
        }
        break;

    default:
        fwrite(STDERR, "unknown action {$job['action']}\n");
        exit(2);
}
echo json_encode($out, JSON_THROW_ON_ERROR), "\n";
