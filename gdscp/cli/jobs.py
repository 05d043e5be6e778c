"""A bulk job (gdscp.bulk) run by a command: the progress bar follows it and
each failure is reported as soon as the job knows of it. Ctrl-C or SIGTERM
while it runs cancels the job (``BulkJob.wait``), which removes its temporary
files before the exception leaves."""

from __future__ import annotations

from typing import Callable

from ..bulk import BulkJob, FileResult
from .progress import TransferProgress

__all__ = ["run_job"]

_SLICE = 0.1  # seconds between looks at the job's failures


def run_job(job: BulkJob, progress: TransferProgress, report: Callable[[FileResult], None]) -> list[FileResult]:
    """Wait for ``job``, calling ``report`` once for each file that fails; every file's result."""
    progress.follow(job)
    seen = 0

    def report_new() -> None:
        nonlocal seen
        failures = job.failures()
        for failure in failures[seen:]:
            report(failure)
        seen = len(failures)

    with job:  # an exception anywhere in here (Ctrl-C) cancels the job, and waits for it to stop
        while not job.wait(_SLICE):
            report_new()
    report_new()
    return job.results()
