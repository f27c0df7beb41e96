<?php

declare(strict_types=1);

// Plain-PHP autoloader (PSR-4, namespace Distbreaker => this folder), so the
// client works with a single `require` and no composer install.
spl_autoload_register(static function (string $class): void {
    $prefix = 'Distbreaker\\';
    if (strncmp($class, $prefix, strlen($prefix)) !== 0) {
        return;
    }
    $file = __DIR__ . '/' . str_replace('\\', '/', substr($class, strlen($prefix))) . '.php';
    if (is_file($file)) {
        require $file;
    }
});
