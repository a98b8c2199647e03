import os
import uuid

import pytest


@pytest.fixture
def url() -> str:
    value = os.environ.get("LEVEE_URL")
    if not value:
        pytest.fail("LEVEE_URL is not set: run these tests from tests/python.rs (cargo test)")
    return value


@pytest.fixture
def key() -> str:
    """A key no other test uses."""
    return f"t-{uuid.uuid4()}"
