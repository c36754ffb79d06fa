"""Progress bars (rich) that can be switched off."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class _NullProgress:
    def add_task(self, *args, **kwargs) -> int:
        return 0

    def update(self, *args, **kwargs) -> None:
        pass

    def advance(self, *args, **kwargs) -> None:
        pass


@contextlib.contextmanager
def progress_bar(enabled: bool = True) -> Iterator:
    """A rich Progress (or a no-op stand-in when ``enabled`` is False)."""
    if not enabled:
        yield _NullProgress()
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=False
    ) as p:
        yield p
