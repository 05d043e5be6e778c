"""A progress bar on stderr for transfers: bytes, rate, ETA and files done.

The bar is fed by polling: a small thread reads ``IOFuture.progress()`` of the
transfers being watched, ten times a second, updates Rich's task and redraws
the bar (Rich's own refresh thread is not used: one thread is all a bar
costs). The engine never calls back into Python. The bar appears only when
stderr is a terminal, without --quiet, and only once the work has lasted
``delay`` seconds, so short commands print nothing but their result. Where
the system refuses the poller its thread (a pids limit), the command goes on
without a bar, said in one warning line.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Optional

from .output import Output

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

__all__ = ["TransferProgress"]


class TransferProgress:
    """Progress of ``total_bytes`` over ``total_files`` files.

    Use as a context manager. ``wait(future)`` waits for an ``IOFuture`` while
    the bar follows its bytes; ``watch``/``finish`` do the same in two steps for
    transfers that overlap; ``follow(job)`` adds a bulk job's bytes and files;
    ``advance(n)`` counts bytes moved some other way; ``file_done()`` counts a
    finished file. ``console``: where the bar goes, a Rich console or a
    command's ``Output`` (its stderr console, made only if a bar shows).
    """

    def __init__(
        self,
        console: Console | Output,
        total_bytes: int,
        total_files: int = 1,
        description: str = "",
        *,
        enabled: bool = True,
        delay: float = 1.0,
        interval: float = 0.1,
    ):
        self.total_bytes = int(total_bytes)
        self.total_files = int(total_files)
        self.description = description
        self._console = console
        self._enabled = enabled
        self._delay = delay
        self._interval = interval
        self._lock = threading.Lock()
        self._done_bytes = 0
        self._done_files = 0
        self._watched: dict[int, Any] = {}
        self._jobs: list[Any] = []
        self._started = time.monotonic()
        self._progress: Optional[Progress] = None
        self._task = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- counting (any thread) ----------------------------------------------------
    @property
    def bytes_done(self) -> int:
        """Bytes of finished transfers plus bytes moved so far by watched ones."""
        with self._lock:
            watched = list(self._watched.values())
            jobs = list(self._jobs)
            done = self._done_bytes
        return done + sum(int(f.progress()) for f in watched) + sum(j.progress().bytes_done for j in jobs)

    @property
    def files_done(self) -> int:
        """Files finished (failed ones too: they are over)."""
        with self._lock:
            jobs = list(self._jobs)
            done = self._done_files
        for job in jobs:
            p = job.progress()
            done += p.files_done + p.files_failed
        return done

    def follow(self, job: Any) -> None:
        """Count a bulk job's bytes and files (``job.progress()``) from now on."""
        with self._lock:
            self._jobs.append(job)

    def watch(self, future: Any) -> None:
        """Follow ``future.progress()`` until ``finish(future, n)``."""
        with self._lock:
            self._watched[id(future)] = future

    def finish(self, future: Any, nbytes: int) -> None:
        """``future`` is over; count its ``nbytes`` for good."""
        with self._lock:
            self._watched.pop(id(future), None)
            self._done_bytes += int(nbytes)

    def wait(self, future: Any) -> int:
        """``future.get()`` (bytes moved, or its exception) while the bar follows it."""
        self.watch(future)
        moved = 0
        try:
            moved = future.get()
        finally:
            self.finish(future, moved)
        return moved

    def advance(self, nbytes: int) -> None:
        with self._lock:
            self._done_bytes += int(nbytes)

    def file_done(self, count: int = 1) -> None:
        with self._lock:
            self._done_files += count

    # -- display --------------------------------------------------------------------
    def _fields(self) -> str:
        if self.total_files <= 1:
            return ""
        return f"{self.files_done}/{self.total_files} files"

    def refresh(self) -> None:
        """Update the bar now; starts it once ``delay`` has passed (called by the poller)."""
        if not self._enabled:
            return
        if self._progress is None:
            if time.monotonic() - self._started < self._delay:
                return
            # Imported only now: most commands end before a bar is due.
            from rich.console import Console  # noqa: PLC0415
            from rich.progress import (  # noqa: PLC0415
                BarColumn,
                DownloadColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                TaskProgressColumn(),
                DownloadColumn(binary_units=True),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[files]}", markup=False),
                console=self._console if isinstance(self._console, Console) else self._console.stderr,
                transient=False,
                auto_refresh=False,  # redrawn by the poller, below
            )
            self._task = self._progress.add_task(
                self.description, total=max(self.total_bytes, 1), files=self._fields()
            )
            self._progress.start()
        self._progress.update(self._task, completed=self.bytes_done, files=self._fields(), refresh=True)

    def _poll(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.refresh()
            except Exception:  # a display problem must never break a transfer
                return

    def __enter__(self) -> "TransferProgress":
        self._started = time.monotonic()
        if self._enabled:
            thread = threading.Thread(target=self._poll, name="gdscp-progress", daemon=True)
            try:
                thread.start()
            except RuntimeError as exc:  # no thread to be had: the transfer matters, its display does not
                self._enabled = False
                self._warn(f"no progress bar: {exc}")
            else:
                self._thread = thread
        return self

    def _warn(self, message: str) -> None:
        if isinstance(self._console, Output):
            self._console.warn(message)
        else:
            self._console.print(f"warning: {message}", markup=False, highlight=False)

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._progress is not None:
            if exc_type is None:
                self._progress.update(self._task, completed=self.bytes_done, files=self._fields(), refresh=True)
            self._progress.stop()
