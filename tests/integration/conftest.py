"""Fixtures of the integration tier (helpers that tests import by name live in conftest_server.py)."""

import pytest
from conftest_server import SharedServers


@pytest.fixture(scope="session")
def shared_servers(tmp_path_factory):
    servers = SharedServers(tmp_path_factory)
    yield servers
    servers.stop_all()
