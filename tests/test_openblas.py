"""NumPy is the reference of `tune` and `bench kernels`: where the environment forces OpenBLAS an older CPU's
kernel, both say so and name the kernel OpenBLAS would choose itself."""
import os
import re
import subprocess
import sys

from workers.openblas import FORCING

NOTE = "from workers import openblas; print(openblas.forced_note())"


def note_with(**forcing: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in FORCING} | forcing
    done = subprocess.run([sys.executable, "-c", NOTE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_forced_kernel_is_named_beside_the_one_openblas_would_choose():
    note = note_with(OPENBLAS_CORETYPE="Prescott")  # a 2004 Pentium 4's kernel (OpenBLAS reports it as Katmai)
    running, own = re.fullmatch(r"NumPy runs OpenBLAS's (\S+) kernel, which the environment forces "
                                r"\(OPENBLAS_CORETYPE=Prescott\); on this CPU it would run (\S+): unset "
                                r"OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE to time NumPy at its best", note).groups()
    assert running in ("Prescott", "Katmai") and own not in ("Prescott", "Katmai"), note


def test_nothing_is_said_where_nothing_is_forced():
    assert note_with() == "None"
