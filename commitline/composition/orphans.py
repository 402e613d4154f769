"""A child process that ends with its parent: a worker started by ``serve --workers N`` or by a parallel rebuild
must not go on serving or rebuilding unattended once the process that started it is gone (killed with -9, say).

Linux's ``PR_SET_PDEATHSIG`` has the kernel send the child a signal when its parent dies; elsewhere nothing is
arranged and the worker is left to finish as it would have.
"""

from __future__ import annotations

import ctypes
import os

_PR_SET_PDEATHSIG = 1


def end_with_parent(sig: int, parent: int) -> bool:
    """Have ``sig`` sent to this process when ``parent`` (the pid that started it) dies. False when it is gone
    already (it may have died before the request was made): the caller then ends itself."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):  # not Linux
        return True
    return os.getppid() == parent
