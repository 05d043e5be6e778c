"""A description of the machine a benchmark ran on, for the JSON record."""

from __future__ import annotations

import datetime
import os
import platform
import re
from typing import Optional

from .. import _core
from ..info import mount_of
from .files import available_memory, free_disk, total_memory

__all__ = ["describe_machine", "filesystem_of", "now_iso"]


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def filesystem_of(directory: str) -> dict:
    """The mount holding ``directory``: mount point, type, source device, and
    for a block device whether it is rotational (from sysfs)."""
    path = os.path.realpath(directory)
    info: dict = {"dir": path, "free_bytes": free_disk(path)}
    mount = mount_of(path)
    if mount["mount_point"] is None:
        return info
    info.update({"mount_point": mount["mount_point"], "type": mount["filesystem"], "source": mount["source"] or ""})
    try:
        with open(f"/sys/dev/block/{mount['device']}/queue/rotational") as f:
            info["rotational"] = f.read().strip() == "1"
    except OSError:
        pass
    return info


def _gpus_from_driver(device: Optional[int]) -> dict:
    """The GPUs as the NVIDIA driver that gdscp loads reports them (without CuPy)."""
    info = _core.cuda_info()
    if not info["available"] or not info["gpus"]:
        return {"available": False, "reason": info["error"] or "the NVIDIA driver reports no GPU"}
    return {
        "available": True,
        "count": len(info["gpus"]),
        "devices": [
            {"index": g["index"], "name": g["name"], "memory_bytes": g["total_memory"],
             "pci_bus_id": g["pci_bus_id"].lower()}
            for g in info["gpus"]
        ],
        "used": device,
        "cuda_driver_api": info["driver_version"],
        "cuda_runtime": None,
        "cupy": None,
    }


def _gpus(device: Optional[int]) -> dict:
    try:
        import cupy
    except ImportError:
        info = _gpus_from_driver(device)
    except Exception as exc:
        return {"available": False, "reason": f"cupy is not importable ({type(exc).__name__}: {exc})"}
    else:
        info = None
    if info is not None:
        return _with_kernel_driver(info)
    runtime = cupy.cuda.runtime
    try:
        count = runtime.getDeviceCount()
        devices = []
        for index in range(count):
            props = runtime.getDeviceProperties(index)
            name = props.get("name", b"")
            devices.append(
                {
                    "index": index,
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "memory_bytes": int(props.get("totalGlobalMem", 0)),
                    "pci_bus_id": f"{props.get('pciDomainID', 0):04x}:{props.get('pciBusID', 0):02x}:"
                    f"{props.get('pciDeviceID', 0):02x}",
                }
            )
        info = {
            "available": count > 0,
            "count": count,
            "devices": devices,
            "used": device,
            "cuda_driver_api": runtime.driverGetVersion(),
            "cuda_runtime": runtime.runtimeGetVersion(),
            "cupy": cupy.__version__,
        }
    except Exception as exc:
        return {"available": False, "reason": f"no usable CUDA device ({type(exc).__name__}: {exc})"}
    return _with_kernel_driver(info)


def _with_kernel_driver(info: dict) -> dict:
    if not info.get("available"):
        return info
    try:
        with open("/proc/driver/nvidia/version") as f:
            first = f.readline()
        # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  ...", or with the
        # open modules "... UNIX Open Kernel Module for x86_64  580.95.05  ..." (as gdscp info).
        version = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", first)
        info["driver"] = version.group(1) if version else first.strip()
    except OSError:
        pass
    return info


def _numa() -> dict:
    """The NUMA nodes online, and the node each GPU's pinned staging is placed
    on (-1: one node, or sysfs does not say)."""
    try:
        with open("/sys/devices/system/node/online") as f:
            online = f.read().strip()
    except OSError:
        online = None
    info: dict = {"online": online, "gpu_nodes": {}}
    cuda = _core.cuda_info()
    if cuda["available"]:
        info["gpu_nodes"] = {str(g["index"]): _core.gpu_numa_node(g["index"]) for g in cuda["gpus"]}
    return info


def describe_machine(directory: str, device: Optional[int] = None) -> dict:
    """CPU, memory, GPUs (through CuPy, when importable), OS and the filesystem of ``directory``."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    return {
        "cpu": {"count": os.cpu_count() or 1, "usable": usable, "model": _cpu_model()},
        "memory": {"total_bytes": total_memory(), "available_bytes": available_memory()},
        "gpu": _gpus(device),
        "os": {"system": platform.system(), "release": platform.release(), "machine": platform.machine()},
        "python": platform.python_version(),
        "filesystem": filesystem_of(directory),
        "numa": _numa(),
        "nvidia_fs": _core.nvidia_fs_present(),
    }
