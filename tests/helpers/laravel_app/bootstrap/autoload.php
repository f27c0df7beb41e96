<?php

// composer's autoloader: this app (App\) and its packages (distbreaker/distbreaker)
require __DIR__ . '/../vendor/autoload.php';

// laravel/framework: Debian's php-laravel-framework (see README.md)
require_once '/usr/share/php/Illuminate/autoload.php';
