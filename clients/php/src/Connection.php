<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * A phpredis connection opened on first use, so that Redis being down is an
 * outage the components handle (fail_open / fail_closed), not an exception in
 * your bootstrap code.
 *
 * `new \Redis()` followed by `connect()` throws when Redis is unreachable,
 * before any breaker exists. Give the components a Connection instead: it
 * connects (with tight timeouts) when a component first needs Redis, and a
 * failed connect is a \RedisException inside the component, where the
 * Redis-unavailable policy applies. After a failure it does not try again for
 * `retry_interval` seconds (calls meanwhile see Redis as unavailable at once,
 * instead of each waiting for a connect timeout).
 *
 *     $redis = Connection::fromConfig(['host' => 'redis', 'port' => 6379]);
 *     $breaker = new CircuitBreaker($redis, 'payments');   // no I/O yet
 */
final class Connection
{
    public const DEFAULTS = [
        'url' => null,
        'scheme' => 'tcp',            // tcp, tls, or unix (host is then the socket path)
        'host' => '127.0.0.1',
        'port' => 6379,
        'username' => null,
        'password' => null,
        'database' => 0,
        'timeout' => 0.25,            // connect timeout, seconds
        'read_timeout' => 0.25,       // per command, seconds
        'persistent' => false,        // reuse the connection across PHP-FPM requests
        'retry_interval' => 1.0,      // seconds without a new connect attempt after a failure
    ];

    /** Connect attempts made so far (for logs and tests). */
    public int $attempts = 0;

    private ?\Redis $client = null;
    private float $retryAt = 0.0;    // monotonic seconds
    private ?string $lastError = null;
    /** @var array<string, mixed> */
    private array $options;

    /** @param array<string, mixed> $options see DEFAULTS; unknown keys are refused */
    public function __construct(array $options = [])
    {
        Options::refuseUnknown($options, 'connection', self::DEFAULTS);
        $o = array_filter($options, static fn ($v) => $v !== null) + self::DEFAULTS;
        if (is_string($o['url']) && $o['url'] !== '') {
            $o = self::parseUrl($o['url']) + $o;
        }
        if (!in_array($o['scheme'], ['tcp', 'tls', 'unix'], true)) {
            throw new \InvalidArgumentException("scheme must be tcp, tls or unix, got '{$o['scheme']}'");
        }
        if (!is_string($o['host']) || $o['host'] === '') {
            throw new \InvalidArgumentException('host must be a non-empty string');
        }
        $o['port'] = filter_var($o['port'], FILTER_VALIDATE_INT, ['options' => ['min_range' => 0, 'max_range' => 65535]]);
        $o['database'] = filter_var($o['database'], FILTER_VALIDATE_INT, ['options' => ['min_range' => 0]]);
        if ($o['port'] === false || $o['database'] === false) {
            throw new \InvalidArgumentException('port must be in [0, 65535] and database >= 0');
        }
        foreach (['timeout', 'read_timeout', 'retry_interval'] as $field) {
            if (!is_numeric($o[$field]) || !is_finite((float) $o[$field]) || (float) $o[$field] < 0) {
                throw new \InvalidArgumentException("{$field} must be a number of seconds >= 0, got " . var_export($o[$field], true));
            }
            $o[$field] = (float) $o[$field];
        }
        $this->options = $o;
    }

    /**
     * From a Laravel-style connection array (host, port, username, password,
     * database, url...); keys this class does not use are ignored.
     *
     * @param array<string, mixed> $config
     */
    public static function fromConfig(array $config): self
    {
        return new self(array_intersect_key($config, self::DEFAULTS));
    }

    /** The connected client; throws \RedisException when Redis cannot be reached now. */
    public function client(): \Redis
    {
        if ($this->client !== null) {
            return $this->client;
        }
        if (hrtime(true) / 1e9 < $this->retryAt) {
            throw new \RedisException("redis unavailable (connect failed: {$this->lastError}); next attempt in "
                . sprintf('%.2f', $this->retryAt - hrtime(true) / 1e9) . ' s');
        }
        $this->attempts++;
        try {
            $this->client = $this->open();
        } catch (\RedisException $e) {
            $this->lastError = $e->getMessage();
            $this->retryAt = hrtime(true) / 1e9 + $this->options['retry_interval'];
            throw $e;
        }
        return $this->client;
    }

    /** Whether a client is connected now (no I/O). */
    public function isConnected(): bool
    {
        return $this->client !== null;
    }

    /** Drop the client; the next use connects again. */
    public function disconnect(): void
    {
        if ($this->client !== null) {
            try {
                $this->client->close();
            } catch (\RedisException) {
                // already gone
            }
        }
        $this->client = null;
    }

    /** Where this connects to, without credentials (for logs). */
    public function describe(): string
    {
        $o = $this->options;
        return $o['scheme'] === 'unix' ? "unix://{$o['host']}/{$o['database']}" : "{$o['scheme']}://{$o['host']}:{$o['port']}/{$o['database']}";
    }

    private function open(): \Redis
    {
        $o = $this->options;
        $redis = new \Redis();
        $host = match ($o['scheme']) {
            'tls' => "tls://{$o['host']}",
            default => $o['host'],
        };
        $port = $o['scheme'] === 'unix' ? 0 : $o['port'];
        $connected = $o['persistent']
            ? $redis->pconnect($host, $port, $o['timeout'], is_string($o['persistent']) ? $o['persistent'] : null)
            : $redis->connect($host, $port, $o['timeout']);
        if ($connected === false) {
            throw new \RedisException("cannot connect to redis at {$this->describe()}");
        }
        $redis->setOption(\Redis::OPT_READ_TIMEOUT, $o['read_timeout']);
        if ($o['password'] !== null && $o['password'] !== '') {
            $credentials = $o['username'] !== null && $o['username'] !== '' ? [$o['username'], $o['password']] : $o['password'];
            if ($redis->auth($credentials) === false) {
                throw new \RedisException("redis at {$this->describe()} refused the credentials");
            }
        }
        if ($o['database'] !== 0 && $redis->select($o['database']) === false) {
            throw new \RedisException("redis at {$this->describe()} refused SELECT {$o['database']}");
        }
        return $redis;
    }

    /** @return array<string, mixed> */
    private static function parseUrl(string $url): array
    {
        $parts = parse_url($url);
        if ($parts === false || !isset($parts['scheme'])) {
            throw new \InvalidArgumentException("cannot parse redis url '{$url}'");
        }
        $scheme = match (strtolower($parts['scheme'])) {
            'redis', 'tcp' => 'tcp',
            'rediss', 'tls' => 'tls',
            'unix' => 'unix',
            default => throw new \InvalidArgumentException("unsupported redis url scheme '{$parts['scheme']}'"),
        };
        $out = ['scheme' => $scheme];
        if ($scheme === 'unix') {
            $out['host'] = $parts['path'] ?? '';
        } else {
            $out['host'] = $parts['host'] ?? '127.0.0.1';
            if (isset($parts['port'])) {
                $out['port'] = $parts['port'];
            }
            $db = trim($parts['path'] ?? '', '/');
            if ($db !== '') {
                $out['database'] = $db;
            }
        }
        if (isset($parts['user']) && $parts['user'] !== '') {
            $out[isset($parts['pass']) ? 'username' : 'password'] = rawurldecode($parts['user']);
        }
        if (isset($parts['pass'])) {
            $out['password'] = rawurldecode($parts['pass']);
        }
        return $out;
    }
}
