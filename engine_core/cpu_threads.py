"""OpenMP in the engine process: only the model thread runs torch's CPU ops in
parallel.

torch runs a CPU op in parallel on an OpenMP team of the thread that calls it, and
each thread that ever runs one keeps a team of its own. GNU OpenMP counts the threads
of every team in the process; once they outnumber the CPUs, every team's threads stop
spinning between parallel regions and sleep at once, so that each parallel op pays
for waking them. A forward pass of a small model is thousands of small ops. On 2
cores, 200 small adds on a thread took 3.5-5.4 ms while that thread's team was the
only one, and 18-23 ms once the main thread had run one large op (a team of its own).
The engine process loads its model and allocates its buffers on the main thread, then
runs every forward pass on the model thread: without care it has two teams, and its
forward passes paid that price (about a fifth of each step of the bench model).

So in a process that runs one engine alone (`server.run_engine` says so with
`one_engine_process`), the thread that builds the engine's core turns serial as the
build begins, before the first torch op (the handshake before it imports no torch):
that thread's torch ops then run on it alone (loading weights is copying memory; the
sampler works in numpy), it never makes a team, and the model thread's team (torch's
default size) is the only one. Other threads of the engine run no torch CPU op (the
fill and the mask kernel are xgrammar's). Elsewhere (an engine core built in a process
that does other torch work, as tests and benches do) nothing changes: that would slow
the process's other work.
"""

from __future__ import annotations

import ctypes
import os
from functools import cache

#: file names of the OpenMP runtimes torch builds link (GNU, Intel, LLVM)
_RUNTIMES = ("libgomp", "libiomp", "libomp")
#: set by `one_engine_process`
_alone = False


def one_engine_process() -> None:
    """This process runs one engine and nothing else (its entry point says so)."""
    global _alone
    _alone = True


def serial_if_one_engine_process() -> bool:
    """`serial_torch_on_this_thread` in a process that runs one engine alone; called
    by the thread that builds the engine's core, before its first torch op."""
    return _alone and serial_torch_on_this_thread()


@cache
def _openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime torch uses, loaded in this process (the one in torch's own
    folder first, where another library brought a second), or None."""
    import torch

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if line.count(" ") >= 5}
    except OSError:  # no /proc: not Linux
        return None
    own = os.path.dirname(torch.__file__)
    runtimes = [p for p in paths if os.path.basename(p).startswith(_RUNTIMES)]
    for path in sorted(runtimes, key=lambda p: (not p.startswith(own), p)):
        lib = ctypes.CDLL(path)  # the loaded library again, not a second copy
        if hasattr(lib, "omp_set_num_threads"):
            return lib
    return None


def serial_torch_on_this_thread() -> bool:
    """From now on, torch's CPU ops called on this thread run on it alone (its OpenMP
    team size is 1); other threads keep torch's default. False where no OpenMP
    runtime is loaded (nothing to do)."""
    import torch

    lib = _openmp()
    if lib is None:
        return False
    # torch sets a thread's OpenMP team size when the thread first asks for it; ask
    # now, so that it cannot undo the setting below later
    torch.get_num_threads()
    lib.omp_set_num_threads(1)
    return True
