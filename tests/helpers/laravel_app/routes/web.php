<?php

use Distbreaker\CallNotPermitted;
use Illuminate\Http\Request;
use Illuminate\Support\Facades\Route;

// clients/php/README.md's controller example: a call through the breaker, with a fallback.
Route::get('/charge/{name}', function (Request $request, string $name) {
    $fail = $request->query('fail') === '1';
    $result = \Distbreaker::breaker($name)->call(
        function () use ($fail) {
            if ($fail) {
                throw new RuntimeException('gateway down');
            }
            return ['status' => 'charged'];
        },
        fn (Throwable $e) => [
            'status' => 'queued',
            'error' => get_class($e),
            'state' => $e instanceof CallNotPermitted ? $e->state : null,
            'retry_after' => $e instanceof CallNotPermitted ? $e->retryAfter : null,
        ],
    );
    return response()->json($result);
});

Route::get('/state/{name}', function (string $name) {
    $breaker = \Distbreaker::breaker($name);
    return response()->json(['state' => $breaker->state(), 'wire' => $breaker->wire]);
});
