"""What the conftests of the library sets share: skip a set's tests where its extra is missing."""
import os

import pytest


def skip_where_missing(items, here: str, absent: list[str], extra: str) -> None:
    """Mark every collected test under `here` skipped, with the reason, when `absent` (the
    set's libraries that are not importable) is not empty."""
    if not absent:
        return
    skip = pytest.mark.skip(reason=f"{extra.split(',')[-1]} extra not installed "
                                   f"({', '.join(absent)} missing): pip install -e '.[{extra}]'")
    for item in items:
        if str(item.path).startswith(here + os.sep):
            item.add_marker(skip)
