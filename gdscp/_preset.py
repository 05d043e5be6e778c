"""Settings given before ``gdscp.defaults`` loads, which it starts from in
place of their ``GDSCP_*`` variables (read once, as it loads).

The ``gdscp`` command puts its ``--threads`` here: the worker pool then
starts at the command line's count, never first at a ``GDSCP_NUM_THREADS``
the system may have no threads for (the workers a pool has started stay,
parked, when it shrinks). A value that is not one the setting takes is left
out, and the variable counts. A variable that holds no value its setting
takes is an error either way. A count the system refuses here is not warned
of: the command sets it again as it runs, and says so then.
"""

__all__ = ["PRESET"]

# Setting name -> value.
PRESET: dict = {}
