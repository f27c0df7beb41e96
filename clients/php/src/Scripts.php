<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * Loads the shared Lua scripts (the package's lua/ folder: the EVAL form of
 * each script in the repository's lua/, written by scripts/sync_php_lua; point
 * lua_dir at such forms, not at the repository's lua/) and runs them with
 * EVALSHA, falling back to EVAL on NOSCRIPT (Redis restarted or SCRIPT FLUSH),
 * which caches the script again.
 */
final class Scripts
{
    /** @var array<string, array{source: string, sha: string}> per process, per file */
    private static array $cache = [];

    /**
     * The default lua/ folder: the one shipped in this package (clients/php/lua,
     * next to src/), wherever composer put it; DISTBREAKER_LUA_DIR overrides it.
     */
    public static function defaultDir(): string
    {
        $env = getenv('DISTBREAKER_LUA_DIR');
        if (is_string($env) && $env !== '') {
            return $env;
        }
        return dirname(__DIR__) . '/lua';
    }

    /**
     * The phpredis client behind what a component was given: a Connection is
     * connected now (throwing \RedisException when Redis is unreachable, which
     * the components' Redis-unavailable policy handles like any outage).
     */
    public static function client(\Redis|\RedisCluster|Connection $redis): \Redis|\RedisCluster
    {
        return $redis instanceof Connection ? $redis->client() : $redis;
    }

    /** @return array{source: string, sha: string} */
    public static function load(string $name, ?string $dir = null): array
    {
        $path = rtrim($dir ?? self::defaultDir(), '/') . "/{$name}.lua";
        if (!isset(self::$cache[$path])) {
            $source = @file_get_contents($path);
            if ($source === false) {
                throw new \RuntimeException("distbreaker script {$path} not found (set the 'lua_dir' option or DISTBREAKER_LUA_DIR)");
            }
            self::$cache[$path] = ['source' => $source, 'sha' => sha1($source)];
        }
        return self::$cache[$path];
    }

    /** Refuse connection options that would change keys or arguments on the wire. */
    public static function checkConnection(\Redis|\RedisCluster|Connection $redis): void
    {
        if ($redis instanceof Connection) {
            return; // it builds its client itself: never a prefix or a serializer
        }
        try {
            $prefix = $redis->getOption(\Redis::OPT_PREFIX);
            $serializer = $redis->getOption(\Redis::OPT_SERIALIZER);
        } catch (\RedisException) {
            return; // not connected (yet): nothing to check, the outage policy applies on use
        }
        if (is_string($prefix) && $prefix !== '') {
            throw new \InvalidArgumentException(
                "the Redis connection has OPT_PREFIX '{$prefix}', which would rename distbreaker's keys "
                . 'and split the fleet; give distbreaker a connection without a key prefix'
            );
        }
        if ($serializer !== \Redis::SERIALIZER_NONE) {
            throw new \InvalidArgumentException('the Redis connection must use Redis::SERIALIZER_NONE for distbreaker');
        }
    }

    /**
     * Run one script; script errors become SchemaError / InvalidArgumentException
     * / DistbreakerException, connection errors stay \RedisException.
     *
     * @param array{source: string, sha: string} $script
     * @param list<string> $keys
     * @param list<string|int> $args
     */
    public static function run(\Redis|\RedisCluster|Connection $redis, array $script, array $keys, array $args): mixed
    {
        $argv = array_merge($keys, array_map('strval', $args));
        $redis = self::client($redis); // may throw \RedisException: Redis unreachable
        try {
            $redis->clearLastError();
            $reply = $redis->evalSha($script['sha'], $argv, count($keys));
            $error = $redis->getLastError();
            if ($reply === false && is_string($error) && str_starts_with($error, 'NOSCRIPT')) {
                $redis->clearLastError();
                $reply = $redis->eval($script['source'], $argv, count($keys));
                $error = $redis->getLastError();
            }
        } catch (\RedisException $e) {
            // phpredis throws (instead of returning false) for error replies whose
            // code is not a standard one (ERR, NOSCRIPT, WRONGTYPE...), e.g. ours.
            if (str_contains($e->getMessage(), 'DISTBREAKER_')) {
                $redis->clearLastError();
                throw self::translate($e->getMessage());
            }
            throw $e; // connection trouble: the callers' Redis-unavailable policy applies
        }
        if ($reply === false && is_string($error) && $error !== '') {
            $redis->clearLastError();
            throw self::translate($error);
        }
        return $reply;
    }

    /** Turn a script's error reply into the client's own exception type. */
    public static function translate(string $text): \Throwable
    {
        $marker = 'DISTBREAKER_SCHEMA ';
        $at = strpos($text, $marker);
        if ($at !== false) {
            $detail = trim(explode(' script:', substr($text, $at + strlen($marker)), 2)[0]);
            $key = explode(' ', $detail, 2)[0];
            return new SchemaError("foreign or corrupt data: {$detail}", $key);
        }
        $at = strpos($text, 'DISTBREAKER_ARGS ');
        if ($at !== false) {
            return new \InvalidArgumentException(trim(explode(' script:', substr($text, $at + 17), 2)[0]));
        }
        if (str_starts_with($text, 'WRONGTYPE')) {
            return new SchemaError("a distbreaker key holds the wrong type: {$text}");
        }
        return new DistbreakerException("redis script error: {$text}");
    }
}
