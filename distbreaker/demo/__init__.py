"""The fleet demo, its flaky upstream and the embedded Redis servers.

Never imported by the library itself (only by the CLI's `demo` command and the tests).
"""
