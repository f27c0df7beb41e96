<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * An operator's injected faults (`distbreaker inject`; docs/KEY_SCHEMA.md, "Fault
 * injection"), as a breaker that allows them (option 'allow_fault_injection' => true)
 * sees them: read with the inject script's "read" op, which also registers the names
 * this process allows, at most once a second per breaker object (a PHP-FPM request
 * pays one round trip per breaker that allows injection; the rest pay nothing).
 */
final class FaultInjection
{
    public const SCRIPT = 'inject';
    /** How long a registration lasts (ms); the CLI refuses selectors nobody registered. */
    public const REGISTRATION_MS = 30000;
    private const REFRESH_S = 1.0;

    /** @var array{source: string, sha: string} */
    private array $script;
    /** @var list<array{kind: string, rate: float, status: int, latency: float, ends: float, reason: string, actor: string, text: string}> */
    private array $faults = [];
    private float $readAt = -INF;

    public function __construct(
        private readonly \Redis|\RedisCluster|Connection $redis,
        private readonly string $name,
        private readonly string $prefix,
        ?string $luaDir = null,
    ) {
        $this->script = Scripts::load(self::SCRIPT, $luaDir);
    }

    /** KEYS of the inject script: the injections hash and its log (one cluster slot). */
    public static function keys(string $prefix): array
    {
        $base = Keys::namespace($prefix) . ':{inject}:fi';
        return [$base, "{$base}:log"];
    }

    /** Whether a selector ('*' any run, '?' one character) covers $name. */
    public static function covers(string $selector, string $name): bool
    {
        $pattern = str_replace(['\*', '\?'], ['.*', '.'], preg_quote($selector, '/'));
        return preg_match('/^' . $pattern . '$/su', $name) === 1;
    }

    /** The injected rejection this call gets, or null. */
    public function rejection(): ?InjectedRejection
    {
        foreach ($this->rolled(['reject']) as $f) {
            return new InjectedRejection($this->name, 'OPEN', 1.0, 'fault injection: ' . $f['text'], null, $f['actor']);
        }
        return null;
    }

    /** Sleep an injected latency, then throw an injected error, for the call about to run. */
    public function disturb(): void
    {
        $error = null;
        $latency = 0.0;
        foreach ($this->rolled(['error', 'latency']) as $f) {
            if ($f['kind'] === 'error') {
                $error ??= $f;
            } else {
                // never past the injection's end: an ended injection delays nothing
                $latency = max($latency, min($f['latency'], $f['ends'] - hrtime(true) / 1e9));
            }
        }
        if ($latency > 0) {
            usleep((int) round($latency * 1e6));
        }
        if ($error !== null) {
            throw new InjectedFault($this->name, $error['status'], $error['reason'], $error['actor']);
        }
    }

    /** @return list<array{kind: string, rate: float, status: int, latency: float, ends: float, reason: string, actor: string, text: string}> */
    private function rolled(array $kinds): array
    {
        $this->refresh();
        $now = hrtime(true) / 1e9;
        $hit = [];
        foreach ($this->faults as $f) {
            if (in_array($f['kind'], $kinds, true) && $f['ends'] > $now && mt_rand() / mt_getrandmax() < $f['rate']) {
                $hit[] = $f;
            }
        }
        return $hit;
    }

    private function refresh(): void
    {
        $sent = hrtime(true) / 1e9;
        if ($sent - $this->readAt < self::REFRESH_S) {
            return;
        }
        $this->readAt = $sent;
        try {
            $raw = Scripts::run($this->redis, $this->script, self::keys($this->prefix),
                ['read', self::REGISTRATION_MS, $this->name]);
            Scripts::expectArray($raw);
        } catch (\RedisException) {
            return; // Redis unavailable: keep what was read (the breaker's outage policy applies)
        } catch (\Throwable) {
            // foreign data in the injections' keys: an optional rehearsal never fails a
            // call; keep what was read (the CLI reports the schema error to the operator)
            return;
        }
        $nowMs = (int) $raw[0];
        $faults = [];
        for ($i = 1; $i + 1 < count($raw); $i += 2) {
            $parts = explode(':', substr((string) $raw[$i], 2), 2);
            if (count($parts) !== 2 || !self::covers($parts[1], $this->name)) {
                continue;
            }
            [$until, $json] = explode(' ', (string) $raw[$i + 1], 2) + [1 => ''];
            $spec = json_decode($json, true);
            if (!is_array($spec) || !isset($spec['rate'])) {
                continue;
            }
            $latency = (float) ($spec['latency_ms'] ?? 0) / 1000;
            $what = match ($parts[0]) {
                'error' => 'error ' . (int) ($spec['status'] ?? 503),
                'latency' => sprintf('latency %gs', $latency),
                default => 'reject',
            };
            $faults[] = [
                'kind' => $parts[0],
                'rate' => (float) $spec['rate'],
                'status' => (int) ($spec['status'] ?? 503),
                'latency' => $latency,
                'ends' => $sent + ((int) $until - $nowMs) / 1000,
                'reason' => (string) ($spec['reason'] ?? ''),
                'actor' => (string) ($spec['actor'] ?? ''),
                'text' => "{$what} on {$parts[1]}",
            ];
        }
        $this->faults = $faults;
    }
}
