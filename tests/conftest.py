"""Suite-wide set-up."""
import signal
import sys

import pytest


def pytest_configure(config):
    """Ctrl-C as a terminal sends it: a suite started as a background job of a non-interactive shell inherits
    SIGINT ignored, and so would every command a test starts (Python then installs no KeyboardInterrupt), so
    the tests that press Ctrl-C on `tune` and `serve` would wait for an interruption that never comes."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts with none of Dynamo's state from the tests before it: a model called at several sizes
    leaves its code marked dynamic, and the next test's graphs would be traced symbolic."""
    yield
    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()
