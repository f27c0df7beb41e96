<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * A fleet-wide retry budget (Finagle semantics) over lua/budget.lua, shared
 * with Python's distbreaker.RetryBudget of the same name: deposit once per
 * logical request, withdraw once per retry; an exhausted budget makes the
 * failure final. Options and defaults are Python's BudgetConfig:
 * percent_can_retry (fraction, 0.2), min_retries_per_sec (10), ttl (10 s),
 * slices (10), plus 'prefix' and 'lua_dir'.
 *
 * While Redis is unreachable deposit() is a no-op and tryWithdraw() says no
 * (no retries): retrying blind during an outage is what a budget exists to stop.
 */
final class RetryBudget
{
    public const SCRIPT = 'budget';
    public const DEFAULTS = ['percent_can_retry' => 0.2, 'min_retries_per_sec' => 10.0, 'ttl' => 10.0, 'slices' => 10];
    private const MILLIONTHS = 1000000;

    public readonly float $percentCanRetry;
    public readonly float $minRetriesPerSec;
    public readonly float $ttl;
    public readonly int $slices;
    public readonly string $key;
    /** True once the stored window geometry was found to differ from this process's. */
    public bool $drift = false;
    /** @var array{source: string, sha: string} */
    private array $script;
    /** @var list<string> ARGV[2..5]: percent and reserve in millionths, ttl ms, slices */
    private array $args;

    /** @param array<string, mixed> $config */
    public function __construct(private readonly \Redis|\RedisCluster|Connection $redis, public readonly string $name, array $config = [])
    {
        $prefix = $config['prefix'] ?? Keys::DEFAULT_PREFIX;
        $luaDir = $config['lua_dir'] ?? null;
        unset($config['prefix'], $config['lua_dir']);
        Options::refuseUnknown($config, 'retry budget', self::DEFAULTS);
        $o = $config + self::DEFAULTS;
        foreach (['percent_can_retry' => 10.0, 'min_retries_per_sec' => 1000000.0] as $field => $top) {
            $v = $o[$field];
            if (!(is_int($v) || is_float($v)) || !is_finite((float) $v) || $v < 0 || $v > $top) {
                throw new \InvalidArgumentException(sprintf('%s must be a number in [0, %g], got %s', $field, $top, var_export($v, true)));
            }
        }
        $ttl = $o['ttl'];
        if (!(is_int($ttl) || is_float($ttl)) || !is_finite((float) $ttl) || $ttl < 0.01 || $ttl > 86400) {
            throw new \InvalidArgumentException('ttl must be in [0.01, 86400] seconds, got ' . var_export($ttl, true));
        }
        if (!is_int($o['slices']) || $o['slices'] < 1 || $o['slices'] > 100) {
            throw new \InvalidArgumentException('slices must be an integer in [1, 100], got ' . var_export($o['slices'], true));
        }
        $this->percentCanRetry = (float) $o['percent_can_retry'];
        $this->minRetriesPerSec = (float) $o['min_retries_per_sec'];
        $this->ttl = (float) $ttl;
        $this->slices = $o['slices'];
        $this->key = Keys::budget($name, $prefix)['slices'];
        $this->args = [
            (string) BreakerConfig::roundHalfEven($this->percentCanRetry * self::MILLIONTHS),
            (string) BreakerConfig::roundHalfEven($this->minRetriesPerSec * $this->ttl * self::MILLIONTHS),
            (string) BreakerConfig::toMs($this->ttl),
            (string) $this->slices,
        ];
        $this->script = Scripts::load(self::SCRIPT, $luaDir);
        Scripts::checkConnection($redis);
    }

    /** Count $amount logical requests; returns the balance after (0 while Redis is down). */
    public function deposit(int $amount = 1): int
    {
        if ($amount < 1) {
            throw new \InvalidArgumentException("amount must be >= 1, got {$amount}");
        }
        try {
            return $this->run('deposit', $amount)['balance'];
        } catch (\RedisException) {
            return 0;
        }
    }

    /** Take one retry from the budget; false when it is exhausted (or Redis is down). */
    public function tryWithdraw(): bool
    {
        try {
            return $this->run('withdraw')['ok'];
        } catch (\RedisException) {
            return false;
        }
    }

    /** Take one retry from the budget or throw RetryBudgetExhausted. */
    public function withdraw(): void
    {
        $reply = $this->run('withdraw');
        if (!$reply['ok']) {
            throw new RetryBudgetExhausted($this->name, $reply['balance'], $reply['deposits'], $reply['withdrawals']);
        }
    }

    /** Retries the fleet may still make now. */
    public function balance(): int
    {
        return $this->run('balance')['balance'];
    }

    /** Forget the window (the next writer's ttl/slices become the stored ones). */
    public function reset(): void
    {
        Scripts::client($this->redis)->del($this->key);
    }

    /** @return array{ok: bool, balance: int, deposits: int, withdrawals: int, now_ms: int, drift: bool} */
    private function run(string $op, int $amount = 1): array
    {
        $raw = Scripts::run($this->redis, $this->script, [$this->key], [$op, ...$this->args, (string) $amount]);
        Scripts::expectArray($raw);
        if (count($raw) < 6) {
            throw new SchemaError('unexpected budget script reply: ' . var_export($raw, true));
        }
        $reply = [
            'ok' => (int) $raw[0] === 1, 'balance' => (int) $raw[1], 'deposits' => (int) $raw[2],
            'withdrawals' => (int) $raw[3], 'now_ms' => (int) $raw[4], 'drift' => (int) $raw[5] === 1,
        ];
        if ($reply['drift'] && !$this->drift) {
            error_log("distbreaker: retry budget '{$this->name}': the stored window geometry differs from this process's ttl/slices");
        }
        $this->drift = $reply['drift'];
        return $reply;
    }
}
