"""Fixtures for the official-SDK tests: emulators on threads, SDK clients pointed at them.

The SDKs are the providers' own Python packages (``runwayml``, ``google-genai``), used as a
real client uses them, with only their base URL pointed at the emulator (and, for the tests
that count requests, their own retries off). ``google-genai`` 2.34.x lives outside .venv in
`GENAI2_DIR` (two versions of one package cannot share a venv); `genai2_path` installs it there
from the pinned requirements file when `make test` has not already done so.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapter_sidecars.emulators import (
    EmulatorThread,
    RunwayConfig,
    RunwayEmulator,
    VeoConfig,
    VeoEmulator,
)
from tests.support.isolated import pip_install

ROOT = Path(__file__).resolve().parents[3]
GENAI2_DIR = ROOT / ".venv" / "sdk-genai2"
GENAI2_REQUIREMENTS = Path(__file__).with_name("genai2-requirements.txt")
RUNWAY_KEY = "key_sdk_test"
GEMINI_KEY = "AIza-sdk-test"
VERTEX_TOKEN = "ya29.sdk-test"


@pytest.fixture
def runway_emulator() -> Iterator[EmulatorThread]:
    """A Runway emulator (real-provider behaviour, exact key) on its own loop thread."""
    with EmulatorThread(RunwayEmulator(RunwayConfig(api_key=RUNWAY_KEY))) as runner:
        yield runner


@pytest.fixture
def veo_emulator() -> Iterator[EmulatorThread]:
    """A Veo emulator (real-provider behaviour, exact key and token) on its own loop thread."""
    config = VeoConfig(api_key=GEMINI_KEY, vertex_token=VERTEX_TOKEN)
    with EmulatorThread(VeoEmulator(config)) as runner:
        yield runner


@pytest.fixture(scope="session")
def genai2_path() -> Path:
    """The site directory holding google-genai 2.34.x, installed on first use.

    The stamp (written here and by `make test`) holds the requirements file's SHA-256, so a
    changed pin reinstalls."""
    stamp = GENAI2_DIR / ".installed"
    want = hashlib.sha256(GENAI2_REQUIREMENTS.read_bytes()).hexdigest()
    if not stamp.exists() or stamp.read_text().strip() != want:
        shutil.rmtree(GENAI2_DIR, ignore_errors=True)
        pip_install(GENAI2_DIR, "-r", str(GENAI2_REQUIREMENTS), timeout=600)
        stamp.write_text(want)
    return GENAI2_DIR
