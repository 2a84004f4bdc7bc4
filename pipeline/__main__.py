"""``python -m pipeline`` and the ``tilegemm`` command: the command line (pipeline.cli.main),
loaded only when run."""

import logging
import os
import sys
from typing import NoReturn

QUIET_CHILD_WARNINGS = "ignore::UserWarning:multiprocessing.resource_tracker"
"""Worker processes stopped while busy (Ctrl-C) leave semaphores behind, which multiprocessing's
resource tracker removes with a warning of its own on our stderr: nothing for the user to do."""


def run() -> NoReturn:
    """Run the command line on ``sys.argv`` and exit with its code."""
    try:
        from pipeline.cli.main import main
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted while starting; nothing was done\n")
        os._exit(1)
    given = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = (
        f"{given},{QUIET_CHILD_WARNINGS}" if given else QUIET_CHILD_WARNINGS
    )
    code = main()
    # Everything is written, closed and unlocked by now: skip the interpreter's teardown of
    # dask, distributed and bokeh modules and threads (a noticeable wait after every job).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
