"""Lanes (priority classes, fair share, partitions) with real workers: the
service tests' fixtures."""
from tests.service.conftest import module_redis, offline_llm, start_worker, tiny_model  # noqa: F401
