"""Suite-wide set-up."""
import os
import shutil
import signal
import sys
import tempfile

import pytest

from workers.object_cache import ENV


def pytest_configure(config):
    """Ctrl-C as a terminal sends it: a suite started as a background job of a non-interactive shell inherits
    SIGINT ignored, and so would every command a test starts (Python then installs no KeyboardInterrupt), so
    the tests that press Ctrl-C on `tune` and `serve` would wait for an interruption that never comes."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # kernels' machine code is cached in a directory of this process's own, which the commands it starts inherit,
    # empty at the start as on a fresh machine and removed at the end: not in the user's, where the suite's
    # thousands of kernels would push out those of the user's models
    config.object_cache = os.environ[ENV] = tempfile.mkdtemp(prefix="tensortune-objects-")


def pytest_unconfigure(config):
    shutil.rmtree(getattr(config, "object_cache", ""), ignore_errors=True)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts with none of Dynamo's state from the tests before it: a model called at several sizes
    leaves its code marked dynamic, and the next test's graphs would be traced symbolic."""
    yield
    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()


@pytest.fixture(autouse=True)
def torch_threads_kept():
    """A command run in this process (tests/test_cli_model.py's `run`) sets PyTorch's thread count to its target's:
    the tests after it get back the count they would have had."""
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    yield
    if threads is not None:
        torch.set_num_threads(threads)
