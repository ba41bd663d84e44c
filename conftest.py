"""Root conftest: registers the fixture modules the perf suite uses (the plugin itself loads via its entry point)."""

pytest_plugins = ["pytester"]
