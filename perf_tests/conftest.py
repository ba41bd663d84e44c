"""perf_tests: the plugin pins torch threads, orders compiling tests last and keeps inductor's caches."""
