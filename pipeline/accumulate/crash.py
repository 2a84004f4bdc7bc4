"""Named crash points between the steps of the accumulation's protocol, for the crash schedule
(tests/pipeline/crash_schedule.py, ``make fuzz-crash``), as SQLite's and git's test suites
stop a program between its steps. Off, and one environment lookup, unless ``TILEGEMM_CRASH_AT``
is set.

``TILEGEMM_CRASH_AT=STEP:N:SIGNAL`` sends SIGNAL (KILL, INT or TERM) when STEP is reached for
the N-th time in any process of the job; ``TILEGEMM_CRASH_COUNT`` names the file whose length
counts the hits (one byte appended per hit: O_APPEND makes each process's byte its own). KILL
goes to the job's whole process group (as ``kill -9 -PGID``), INT and TERM to its leader (the
command, as Ctrl-C or ``kill`` would).
"""

from __future__ import annotations

import os
import signal
import time

AT = "TILEGEMM_CRASH_AT"
COUNT = "TILEGEMM_CRASH_COUNT"

STEPS = (
    "begin.listings",  # the input listings written, before C's metadata and the state
    "begin.state",  # the state written: the accumulation has started
    "move.object",  # one of a tile's objects moved into original/
    "move.marker",  # a tile's marker written: its originals are all saved
    "write.band",  # a band of a tile written into C
    "write.tile",  # a tile journaled
    "finish.complete",  # the state says complete
    "clean.file",  # one file of the accumulation's folder removed
    "clean.state",  # the state removed
    "rollback.state",  # the state says rolling back
    "rollback.tile",  # a tile's objects C did not hold removed, its marker gone
    "rollback.object",  # one original moved home
)
"""Every crash point, in the order a run reaches them."""


def point(step: str) -> None:
    """Crash here when the schedule says so (nothing otherwise)."""
    wanted = os.environ.get(AT)
    if not wanted:
        return
    name, _, rest = wanted.partition(":")
    nth, _, sig = rest.partition(":")
    if name != step or not nth.isdigit() or not hasattr(signal, f"SIG{sig}"):
        return
    fd = os.open(os.environ[COUNT], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, b".")
        hits = os.lseek(fd, 0, os.SEEK_CUR)  # the end of this process's own byte
    finally:
        os.close(fd)
    if hits != int(nth):
        return
    signum = getattr(signal, f"SIG{sig}")
    leader = os.getpgid(0)
    if signum == signal.SIGKILL:
        os.killpg(leader, signum)
    else:
        os.kill(leader, signum)
        time.sleep(0.5)  # the signal lands while the step is still where the schedule says
