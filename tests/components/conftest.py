"""Fixtures shared by the component tests."""

from __future__ import annotations

import pytest
from support import start_device_service


@pytest.fixture
def device_service(tmp_path):
    """A real GPU-sharing device service process on a virtual device (a :class:`support.DeviceService`), killed
    after the test."""
    handle = start_device_service(tmp_path)
    try:
        yield handle
    finally:
        if handle.process.poll() is None:
            handle.process.kill()
        handle.process.wait(timeout=10)
