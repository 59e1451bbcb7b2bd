"""Shared fixtures: real boards on 127.0.0.1, a real store, a real Prefect test server.

Everything expensive is session-scoped: one local board (tracker + 2 rpc servers), one
imported and extracted micronet, one Prefect harness.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("VTA_PIPELINE_BOARD_RETRIES", "0")  # tests assert on the first failure
# the boards the tests start record themselves (and log) here, not in the user's ~/.vta-pipeline
os.environ.setdefault("VTA_PIPELINE_BOARD_REGISTRY", tempfile.mkdtemp(prefix="vta-pipeline-test-boards-"))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from vta_pipeline import steps  # noqa: E402
from vta_pipeline.boards import LocalBoard  # noqa: E402
from vta_pipeline.config import ModelConfig  # noqa: E402
from vta_pipeline.store.artifacts import ArtifactStore  # noqa: E402
from vta_pipeline.targets import resolve_target  # noqa: E402

OUTPUTS = Path(__file__).resolve().parent.parent / "test-outputs"


@pytest.fixture(scope="session")
def host_target():
    return resolve_target("host")


@pytest.fixture(scope="session")
def board():
    """A real local board: tracker and two rpc_server processes under key 'test'."""
    b = LocalBoard(key="test", num_servers=2).start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def session_store(tmp_path_factory):
    return ArtifactStore(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="session")
def micronet(session_store, host_target):
    """micronet fetched and its tasks extracted, in the session store."""
    fetched = steps.fetch_step(session_store, ModelConfig(source="builtin", name="micronet"))
    extracted = steps.extract_step(session_store, fetched, host_target)
    return fetched, extracted


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real `prefect server start` (API, both UIs, services) on a free 127.0.0.1 port; its
    log is kept as test-outputs/prefect-server.log."""
    from prefect_server import PrefectServer

    server = PrefectServer(workdir=tmp_path_factory.mktemp("prefect-server"))
    try:
        with server:
            yield server
    finally:
        server.save_log(OUTPUTS / "prefect-server.log")


@pytest.fixture(scope="session")
def deployed_nightly(prefect_server, board, tmp_path_factory):
    """The nightly deployment, deployed and triggered by hand, run by a real worker (once)."""
    from nightly_deployment import deploy_and_run

    return deploy_and_run(prefect_server, board, tmp_path_factory.mktemp("nightly") / "store", OUTPUTS / "deployment")


@pytest.fixture
def store(tmp_path):
    return ArtifactStore(tmp_path / "store")
