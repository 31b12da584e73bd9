"""Which BLAS kernel NumPy runs, and whether the environment forced it: a container image may set
OPENBLAS_CORETYPE (for old OpenBLAS builds that crash on new CPUs), and then NumPy, the reference of `tune` and
`bench kernels`, runs an older CPU's kernel (a Zen 5 forced to Haswell's: 1024³ at 2 threads 230 GFLOPS, 479 with
its own SkylakeX kernel). OpenBLAS chooses when it loads, so its own choice is read in a fresh process."""
from __future__ import annotations

import os
import subprocess
import sys

from threadpoolctl import threadpool_info

FORCING = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_KERNELS = ("import numpy, threadpoolctl\n"  # the kernels of the BLAS libraries NumPy loads, as `kernels` reads them
            "print(*sorted({i.get('architecture') for i in threadpoolctl.threadpool_info()\n"
            "               if i.get('user_api') == 'blas'}))")


def description() -> str:
    """The BLAS libraries NumPy loaded, with their version and kernel, and the variables that force a kernel."""
    info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    kernel = ", ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})" for i in info)
    env = {k: os.environ[k] for k in FORCING if k in os.environ}
    return kernel + (f"; environment {env}" if env else "")


def kernels() -> list[str]:
    """The kernels (OpenBLAS's `architecture`) of the BLAS libraries NumPy loaded."""
    return sorted({i.get("architecture") for i in threadpool_info() if i.get("user_api") == "blas"})


def forced_note() -> str | None:
    """A line saying that NumPy's figures are of a kernel the environment forced, and which one OpenBLAS would run
    on this CPU; None where nothing is forced or the kernel is the same."""
    if not any(k in os.environ for k in FORCING):
        return None
    running = kernels()
    unforced = {k: v for k, v in os.environ.items() if k not in FORCING}
    own = subprocess.run([sys.executable, "-c", _KERNELS], env=unforced, capture_output=True, text=True,
                         timeout=120).stdout.split()
    if not own or own == running:
        return None
    setting = ", ".join(f"{k}={os.environ[k]}" for k in FORCING if k in os.environ)
    return (f"NumPy runs OpenBLAS's {' '.join(running)} kernel, which the environment forces ({setting}); on this CPU "
            f"it would run {' '.join(own)}: unset {' and '.join(FORCING)} to time NumPy at its best")
