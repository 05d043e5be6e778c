"""Cleanup that an interrupt must not cut short: a step run again until it
completes, with each Ctrl-C or SIGTERM that lands meanwhile caught (a second
one must not leave a job running, a temporary file behind or a handler out
of place). The caller raises the first one caught, or drops it where the
exception it serves is already on its way."""

from __future__ import annotations

import sys
from typing import Callable, Optional

__all__ = ["ended_by_uncaught_exception", "through_interrupts"]


def ended_by_uncaught_exception() -> bool:
    """At interpreter exit: whether an exception nothing caught ends the
    program (Ctrl-C outside any wait, say), so that what still runs is to be
    cancelled, as a wait it interrupted would have. Not at the interactive
    prompt, whose ``sys.last_value`` is any earlier error's."""
    return getattr(sys, "last_value", None) is not None and not hasattr(sys, "ps1")


def through_interrupts(step: Callable[[], object]) -> Optional[BaseException]:
    """Run ``step()`` until it returns; the first exception caught on the way
    (None if none). ``step`` must be safe to run again after a partial run."""
    first: Optional[BaseException] = None
    while True:
        try:
            step()
            return first
        except BaseException as exc:  # noqa: BLE001 - the caller decides what becomes of it
            first = first or exc
