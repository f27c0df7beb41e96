<?php

declare(strict_types=1);

namespace Distbreaker;

/**
 * The key schema v2 (docs/KEY_SCHEMA.md): every key of one protected name
 * carries the hash tag {name} after the versioned namespace <prefix>:v2, so
 * each script touches one Redis Cluster slot. Mirrors distbreaker/_runtime/keys.py.
 */
final class Keys
{
    public const SCHEMA_VERSION = '2';
    public const DEFAULT_PREFIX = 'distbreaker';
    public const MAX_NAME_LENGTH = 200;
    public const MAX_PREFIX_LENGTH = 100;

    /**
     * A protected name: 1-200 printable characters, no whitespace or control characters, not starting with '}'.
     * "Printable" is fixed on Unicode 14.0 (NameChars, generated with the Python client's table), not PCRE's.
     */
    public static function validateName(string $name): string
    {
        $length = preg_match('//u', $name) === 1 ? preg_match_all('/./us', $name) : -1;
        if ($length < 1 || $length > self::MAX_NAME_LENGTH) {
            throw new \InvalidArgumentException(sprintf(
                'name must be 1-%d characters of valid UTF-8, got %s',
                self::MAX_NAME_LENGTH,
                $length < 0 ? 'invalid UTF-8' : (string) $length,
            ));
        }
        if (preg_match(NameChars::REFUSED, $name) === 1) {
            throw new \InvalidArgumentException("name must not contain whitespace or control characters, got '{$name}'");
        }
        if (str_starts_with($name, '}')) {
            // "{}...": an empty hash tag, so each key would land in its own cluster slot
            throw new \InvalidArgumentException("name must not start with '}', got '{$name}'");
        }
        return $name;
    }

    /** A key prefix: printable, no whitespace, no braces (they would steal the hash tag). */
    public static function validatePrefix(string $prefix): string
    {
        $length = preg_match('//u', $prefix) === 1 ? preg_match_all('/./us', $prefix) : -1;
        if ($length < 1 || $length > self::MAX_PREFIX_LENGTH) {
            throw new \InvalidArgumentException(sprintf('prefix must be 1-%d characters, got %s', self::MAX_PREFIX_LENGTH, (string) $length));
        }
        if (str_contains($prefix, '{') || str_contains($prefix, '}') || preg_match(NameChars::REFUSED, $prefix) === 1) {
            throw new \InvalidArgumentException("prefix must not contain braces, whitespace or control characters, got '{$prefix}'");
        }
        return $prefix;
    }

    /** The versioned namespace every key starts with, e.g. "distbreaker:v2". */
    public static function namespace(string $prefix = self::DEFAULT_PREFIX): string
    {
        return self::validatePrefix($prefix) . ':v' . self::SCHEMA_VERSION;
    }

    /**
     * The pub/sub channel every transition of every breaker in database $db is published
     * on: "<ns>:events" for db 0, "<ns>:events:db<N>" otherwise (pub/sub ignores databases).
     */
    public static function eventsChannel(string $prefix = self::DEFAULT_PREFIX, int $db = 0): string
    {
        $base = self::namespace($prefix) . ':events';
        return $db === 0 ? $base : "{$base}:db{$db}";
    }

    /** "<ns>:{<name>}", the start of every key of one protected name. */
    public static function base(string $name, string $prefix = self::DEFAULT_PREFIX): string
    {
        return self::namespace($prefix) . ':{' . self::validateName($name) . '}';
    }

    /**
     * Breaker keys in script order: state record (a string), meta hash, probe zset,
     * history stream; and the events channel.
     *
     * @return array{state: string, meta: string, probes: string, history: string, channel: string}
     */
    public static function breaker(string $name, string $prefix = self::DEFAULT_PREFIX, int $db = 0): array
    {
        $base = self::base($name, $prefix);
        return [
            'state' => "{$base}:cb",
            'meta' => "{$base}:cb:meta",
            'probes' => "{$base}:cb:probes",
            'history' => "{$base}:cb:events",
            'channel' => self::eventsChannel($prefix, $db),
        ];
    }

    /** @return array{leases: string, meta: string, notify: string} */
    public static function bulkhead(string $name, string $prefix = self::DEFAULT_PREFIX): array
    {
        $base = self::base($name, $prefix);
        return ['leases' => "{$base}:bh", 'meta' => "{$base}:bh:meta", 'notify' => "{$base}:bh:notify"];
    }

    /** @return array{slices: string} */
    public static function budget(string $name, string $prefix = self::DEFAULT_PREFIX): array
    {
        // budget layout 2 (a string); layout 1 was the hash ':rb' (docs/KEY_SCHEMA.md)
        return ['slices' => self::base($name, $prefix) . ':rb2'];
    }

    /** @return array{members: string, leases: string, history: string} the pool's keys in script order */
    public static function pool(string $name, string $prefix = self::DEFAULT_PREFIX): array
    {
        $base = self::base($name, $prefix);
        return ['members' => "{$base}:pool", 'leases' => "{$base}:pool:leases", 'history' => "{$base}:pool:events"];
    }

    /** @return array{bucket: string} */
    public static function rateLimiter(string $name, string $prefix = self::DEFAULT_PREFIX): array
    {
        return ['bucket' => self::base($name, $prefix) . ':rl'];
    }
}
