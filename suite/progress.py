"""The progress bar long runs show (rich): count, elapsed time and ETA, on stderr."""

from __future__ import annotations

from typing import Any


def progress_bar(label: str, *extra_columns: Any):
    """A started-later ``rich.progress.Progress``: label, bar, done/total, elapsed, eta."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("eta"), TimeRemainingColumn(), *extra_columns,
                    console=Console(stderr=True, soft_wrap=True))
