"""The child's start gate: a job starts, and a step not recorded yet runs, only while it is
open, that is while the parent's heartbeat says no peer can have rescued this worker's jobs
(``shardworker.worker.heartbeat``). The lanes (``shardworker.child.lanes``) and the steps
(``shardworker.child.steps``) look at it; closed, they look again every ``GATE_POLL_S``."""

from __future__ import annotations

import time
from typing import Any

from shardworker.core import procs

GATE_POLL_S = 0.05  # how often a lane or a step looks again at a closed gate


class StartGate:
    """Open before ``alive_until``, two shared doubles the parent's heartbeat moves on after each
    beat that found this worker's row: a deadline on the boot-time clock (it runs through a
    suspend) and one on the wall clock (which a VM's guest agent or NTP sets right after a pause
    the guest's own clocks did not see); or always, without them."""

    def __init__(self, alive_until: Any = None) -> None:
        self._until = alive_until

    def open(self) -> bool:
        until = self._until
        return until is None or (procs.boottime() < until[0] and time.time() < until[1])
