"""docs/testing.md shows the example test of ``shardworker.testing`` as the suite runs it:
the page's code block is tests/testing/test_welcome_example.py, word for word."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "tests" / "testing" / "test_welcome_example.py"


def test_the_documented_example_is_the_one_the_suite_runs() -> None:
    page = (REPO / "docs" / "testing.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```$", page, re.MULTILINE | re.DOTALL)
    assert EXAMPLE.read_text(encoding="utf-8") in blocks, "docs/testing.md lost or changed the example test"
