"""Signals in tests that send Ctrl-C to a child process."""

from __future__ import annotations

import signal


def ctrl_c_reaches_it() -> None:
    """Popen's preexec_fn: SIGINT back to its default in the child. A test suite started in the
    background of a non-interactive shell (`cmd &`) runs with SIGINT ignored, every child inherits
    that, and Python then installs no KeyboardInterrupt handler: the child would never see Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
