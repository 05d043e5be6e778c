"""One job over many processes: ``mpiexec -n N gdscp copy|read|write ...``
(or ``srun``) splits the files, and large files' chunks, by bytes across the
ranks; each rank moves its share through its node-local GPU.

Nothing here imports mpi4py until a launcher says this process is one rank
of several (``gdscp.mpi.launch``, the standard library only); ``import
gdscp`` never does. ``world()`` is the communicator of such a job, or None
for a process on its own. docs/cluster.md says how to run it.
"""

from __future__ import annotations

from .launch import Launch, check_switch, launched, node_device

__all__ = ["Launch", "check_environment", "connected", "launched", "node_device", "world"]

_connected = False  # world() was called: this rank has met (or tried to meet) the others


def check_environment() -> None:
    """The ``GDSCP_MPI*`` variables checked (``EnvironmentVariableError`` for
    a bad one), before MPI starts: a rank that finds one bad joins the others
    to say so, as for a bad setting (gdscp.cli.main)."""
    from .comm import abort_after  # noqa: PLC0415 - light: mpi4py only in connect()

    check_switch()
    abort_after()


def connected() -> bool:
    """Whether this process has called ``world()`` (whatever came of it)."""
    return _connected


def world():
    """The ``gdscp.mpi.comm.World`` of this job when it runs as one rank of
    several, else None (no launcher, a world of one, or ``GDSCP_MPI=0``).
    Raises ``gdscp.mpi.comm.Unavailable`` when a launcher started several
    ranks but mpi4py cannot be imported: each rank would otherwise do the
    whole job."""
    global _connected
    launch = launched()
    if launch is None:
        return None
    _connected = True
    from .comm import connect  # noqa: PLC0415 - mpi4py, only for a job of several ranks

    return connect(launch)
