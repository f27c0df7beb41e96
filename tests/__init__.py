"""distbreaker's test suite (a package, so test modules and helpers import as tests.*)."""
