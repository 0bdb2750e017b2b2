"""What the appliers' tests share: a private test-driver host of three VMs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest

from tests.support.appliers import NODE


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[Any]:
    """A private test-driver host (each open of a node file starts from the file)."""
    node = tmp_path / "node.xml"
    node.write_text(NODE)
    c = libvirt.open(f"test://{node}")
    yield c
    c.close()
