"""Which rank of which job this process is, from its launcher's environment
alone (no MPI library is loaded; of gdscp, only its light argument and error
modules): Open MPI and PRRTE (``OMPI_COMM_WORLD_*``), MPICH's Hydra and Intel
MPI (``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``), PMIx launchers,
MVAPICH (``MV2_COMM_WORLD_*``), Cray PALS and SLURM's ``srun``
(``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``, ``SLURM_LOCALID``; a batch
script's own environment, which has no step, is not a launch).

``node_device()`` is the GPU a rank uses when nothing names one: its local
rank modulo the GPUs it can see (CUDA_VISIBLE_DEVICES is already applied to
that count by the driver).
"""

from __future__ import annotations

import os
from typing import Mapping, NamedTuple, Optional

from .._args import FALSE_WORDS, TRUE_WORDS
from .._errors import invalid_variable

__all__ = ["Launch", "check_switch", "launched", "node_device"]

# (rank, size, local rank, local size) variables of each launcher, first match wins.
_LAUNCHERS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("PALS_RANKID", "PALS_SIZE", "PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE"),
    ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"),
)


class Launch(NamedTuple):
    rank: int
    size: int
    local_rank: int  # among the ranks of this node
    local_size: Optional[int]  # ranks on this node, where the launcher says
    launcher: str  # the variable the rank came from


def _int(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    try:
        return int(text.split("(")[0].split(",")[0])  # SLURM_STEP_TASKS_PER_NODE reads "4(x2)"
    except ValueError:
        return None


def launched(environ: Optional[Mapping[str, str]] = None) -> Optional[Launch]:
    """This process's place in a job of several ranks, or None: no launcher,
    a world of one, or ``GDSCP_MPI=0`` (each process on its own)."""
    env = os.environ if environ is None else environ
    if env.get("GDSCP_MPI", "").strip().lower() in FALSE_WORDS:
        return None
    for rank_var, size_var, local_var, local_size_var in _LAUNCHERS:
        rank, size = _int(env.get(rank_var)), _int(env.get(size_var))
        if rank is None or size is None:
            continue
        if size <= 1:
            return None
        local = _int(env.get(local_var))
        return Launch(rank, size, rank if local is None else local, _int(env.get(local_size_var)), rank_var)
    return None


def check_switch(environ: Optional[Mapping[str, str]] = None) -> None:
    """``GDSCP_MPI`` checked: ``EnvironmentVariableError`` for a value that is
    neither true nor false (a rank with such a value still counts as one, so
    that it joins the others to say so)."""
    env = os.environ if environ is None else environ
    raw = env.get("GDSCP_MPI")
    if raw is not None and raw.strip() and raw.strip().lower() not in TRUE_WORDS | FALSE_WORDS:
        raise invalid_variable("GDSCP_MPI", raw, f"{raw.strip()!r} is neither true nor false",
                               "1 or 0 (true/false, yes/no, on/off; 0: each process runs on its own)")


def node_device(visible: int, environ: Optional[Mapping[str, str]] = None) -> int:
    """The GPU of this rank among the ``visible`` ones of its node: its local
    rank modulo ``visible`` (0 for a process on its own)."""
    launch = launched(environ)
    if launch is None or visible <= 1:
        return 0
    return launch.local_rank % visible
