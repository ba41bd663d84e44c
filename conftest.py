"""Root conftest: registers the fixture modules of the perf suite (the plugin loads via its entry point)."""

pytest_plugins = ["pytester", "fixtures.tiny", "fixtures.workloads", "fixtures.data"]
