import logging
import os
import sys

from pipeline.cli import main

if __name__ == "__main__":
    code = main()
    # Everything is written, closed and unlocked by now: skip the interpreter's teardown of
    # dask, distributed and bokeh modules and threads (0.25-0.4 s after every job).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
