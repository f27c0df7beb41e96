<?php

return ['driver' => 'array', 'lifetime' => 120, 'cookie' => 'laravel_session', 'path' => '/', 'domain' => null];
