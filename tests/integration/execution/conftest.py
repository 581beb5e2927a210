"""Fixtures of the execution suite.

NOTE: this file was accidentally overwritten by the execution-engine work; the output-fetch
fixtures below (`file_server`, `http`, `fs_store`, `moto_s3`) are a reconstruction from what
test_output_fetch.py uses. Its owner should put their original definitions back here; the
execution-engine fixtures live in `exec_harness.py` and are only re-exported.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from controlplane.storage import FilesystemObjectStore
from tests.integration.execution.exec_harness import harness, lite
from tests.integration.execution.file_server import FileServer, running_file_server
from tests.integration.storage.moto_s3 import moto_s3

__all__ = ["file_server", "fs_store", "harness", "http", "lite", "moto_s3"]


@pytest.fixture
def file_server() -> Iterator[FileServer]:
    """A local HTTP server playing the provider's output host."""
    with running_file_server() as server:
        yield server


@pytest_asyncio.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """The HTTP client fetch_output uses (redirects followed by fetch_output itself)."""
    async with httpx.AsyncClient(timeout=5.0) as client:
        yield client


@pytest.fixture
def fs_store(tmp_path: Path) -> FilesystemObjectStore:
    """A filesystem object store in the test's temporary folder."""
    return FilesystemObjectStore(tmp_path / "objects")
