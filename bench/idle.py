"""What an idle worker costs: ``shardworker run --procs N`` with nothing queued, its whole
process tree's CPU (from /proc) over a window after startup, per process.

    python bench/idle.py                 # a temporary embedded server, --procs 2, 10 s
    python bench/idle.py --seconds 30 --procs 4 --dsn postgresql://...

Target (issue 25): under 1% of one core at --procs 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

from bench_db import database

APP = "from shardworker import App\napp = App()\n\n\n@app.handler('noop')\ndef noop(job):\n    return None\n"


def tree_ticks(pgid: int) -> dict[int, tuple[int, str]]:
    """CPU ticks (user + system) and command line of every live process in group ``pgid``."""
    found: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            with open(f"/proc/{name}/comm") as f:
                command = f.read().strip()  # sw-shard-N, sw-flusher (each names itself), else the parent
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        found[int(name)] = (int(fields[11]) + int(fields[12]), command)
    return found


def role(command: str) -> str:
    if "resource_tracker" in command:
        return "resource tracker"
    return command if command.startswith("sw-") else "parent"


def start_worker(project: str, app: str, source: str, dsn: str, procs: int) -> subprocess.Popen[bytes]:
    """``shardworker run`` of the app ``source`` (written to ``project/APP.py``) from ``project``,
    leading a process group of its own (its pid is the group's: ``tree_ticks(worker.pid)``)."""
    with open(os.path.join(project, f"{app}.py"), "w") as f:
        f.write(source)
    return subprocess.Popen([sys.executable, "-m", "shardworker", "run", "--app", app, "--procs", str(procs),
                             "--outbox-dir", "sw-outbox", "--dsn", dsn], cwd=project,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="a scratch database (default: a temporary embedded server)")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0, help="the measured window")
    parser.add_argument("--settle", type=float, default=4.0, help="seconds after launch before measuring")
    args = parser.parse_args()
    with database(args.dsn) as dsn, tempfile.TemporaryDirectory(prefix="sw-idle-") as project:
        worker = start_worker(project, "idle_app", APP, dsn, args.procs)
        try:
            time.sleep(args.settle)
            before, started = tree_ticks(worker.pid), time.monotonic()
            time.sleep(args.seconds)
            after, elapsed = tree_ticks(worker.pid), time.monotonic() - started
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(30)
    hz = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid, (ticks, command) in sorted(after.items()):
        share = (ticks - before.get(pid, (0, ""))[0]) / hz / elapsed * 100
        total += share
        print(f"  pid {pid:>7}  {role(command):<16}  {share:5.2f}% of a core")
    print(f"idle worker tree, --procs {args.procs}, {elapsed:.0f} s: {total:.2f}% of a core "
          f"({'meets' if total < 1 else 'misses'} the < 1% target)")


if __name__ == "__main__":
    main()
