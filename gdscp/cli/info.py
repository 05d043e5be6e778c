"""``gdscp info``: what this machine offers gdscp, and how each PATH would be read."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich.console import Group
from rich.table import Table

from .. import info as sysinfo
from . import options
from .output import EXIT_FAILURE, Output, shown
from .units import format_bytes

__all__ = ["info"]


def _yes_no(value: object) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _system_table(system: dict[str, Any]) -> Table:
    table = Table(title="system", title_justify="left", show_header=False)
    table.add_column("item", style="bold")
    table.add_column("value")
    cuda = system["cuda"]
    versions = system["gdscp"]
    table.add_row(
        "gdscp",
        f"{versions['version']} (Python {versions['python']}, numpy {versions['numpy']}, "
        f"CuPy {versions['cupy'] or 'not installed'})",
    )
    if cuda["available"]:
        table.add_row(
            "NVIDIA driver",
            f"{cuda['driver_version'] or 'unknown'} (CUDA {cuda['cuda_version']}, {cuda['library']})",
        )
    else:
        table.add_row("NVIDIA driver", f"not available: {cuda['error']}")
    if system["gpus"]:
        for gpu in system["gpus"]:
            memory = format_bytes(gpu["total_memory"])
            table.add_row(f"GPU {gpu['index']}", f"{gpu['name']}, {memory}, PCI {gpu['pci_bus_id']}")
    else:
        table.add_row("GPUs", "none")
    cufile = system["cufile"]
    if cufile["available"]:
        table.add_row("libcufile", f"{cufile['version'] or 'unknown version'} ({cufile['library']})")
    else:
        table.add_row("libcufile", f"not loaded: {cufile['error']}")
    nvfs = system["nvidia_fs"]
    table.add_row("nvidia-fs", f"present, version {nvfs['version']}" if nvfs["present"] else "not loaded")
    cj = system["cufile_json"]
    detail = "exists" if cj["exists"] else "missing (libcufile's built-in defaults apply)"
    if cj["exists"] and cj["allow_compat_mode"] is not None:
        detail += f", allow_compat_mode={str(cj['allow_compat_mode']).lower()}"
    if cj["error"]:
        detail += f", unreadable: {cj['error']}"
    table.add_row("cufile.json", f"{cj['path']} ({cj['source']}; {detail})")
    settings = system["settings"]
    if system["compat_mode_preferred"]:
        using = "device I/O uses the POSIX path"
    elif system["cufile"]["available"]:
        using = "device I/O uses cuFile"
    else:
        using = "device I/O would use cuFile, which is not loaded here: it fails"
    table.add_row("compat mode", f"{settings['compat_mode']} ({using})")
    table.add_row(
        "settings",
        f"threads {settings['num_threads']}, task size {format_bytes(settings['task_size'])}, "
        f"GDS threshold {format_bytes(settings['gds_threshold'])}, "
        f"bounce buffer {format_bytes(settings['bounce_buffer_size'])}, direct I/O {_yes_no(settings['direct_io'])}",
    )
    return table


def _path_table(p: dict[str, Any]) -> Table:
    table = Table(title=f"path {shown(p['path'])}", title_justify="left", show_header=False)
    table.add_column("item", style="bold")
    table.add_column("value")
    table.add_row("kind", p["kind"])
    table.add_row("filesystem", f"{p['filesystem'] or '?'} ({shown(p['source'] or '?')} on "
                                f"{shown(p['mount_point'] or '?')})")
    o_direct = _yes_no(p["o_direct"])
    if p["o_direct_reason"]:
        o_direct += f" ({p['o_direct_reason']})"
    table.add_row("O_DIRECT", o_direct)
    table.add_row("backend", p["backend"] or "unknown")
    table.add_row("why", p["backend_reason"] or "")
    return table


def info(
    paths: Annotated[
        Optional[list[str]],
        typer.Argument(
            metavar="PATH...",
            help="Files or directories to check (filesystem, O_DIRECT, backend).",
            show_default=False,
        ),
    ] = None,
    compat_mode: options.CompatModeOpt = None,
    json: options.Json = False,
    quiet: options.Quiet = False,
    debug: options.Debug = False,
) -> None:
    """Show what GPUDirect Storage needs here, and how each PATH would be read (like gdscheck -p).

    GPUs, NVIDIA driver and CUDA versions, libcufile (version and where it was
    loaded from), nvidia-fs, the cufile.json in force and the compat mode; for
    each PATH, its filesystem, whether O_DIRECT opens there, and which backend
    a read into GPU memory would use, and why.

    Example: gdscp info /mnt/nvme /data/file.bin --json
    """
    out = Output("info", json=json, quiet=quiet, debug=debug)
    with out.guard(), options.settings(compat_mode=compat_mode):
        system = sysinfo.system_info()
        checked = []  # every path in order; one that could not be checked has its "error"
        failed = False
        for p in paths or []:
            path = options.check_path(p)
            try:
                checked.append(sysinfo.path_info(path))
            except OSError as exc:
                out.error(f"cannot check '{path}': {exc.strerror}")
                checked.append({"path": path, "error": exc.strerror or str(exc)})
                failed = True
        data = {"command": "info", "ok": not failed, **system, "paths": checked}

        def render() -> Group:
            return Group(_system_table(system), *(_path_table(p) for p in checked if "error" not in p))

        out.result(data, render)
        if failed:
            raise typer.Exit(EXIT_FAILURE)
