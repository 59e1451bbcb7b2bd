"""Each command-line run keeps its full log in the store: `<store>/logs/run-<time>-<pid>.log`.

The console shows what a user acts on (progress, results, errors). The log file gets that
and what helps a developer: every INFO record of our library, Prefect and TVM, and Python
warnings (a library's deprecation notice, say), which go only there.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

LOGGERS = ("", "prefect", "vta_pipeline", "tvm", "py.warnings", "vta_pipeline_details")
"""The root logger and the ones that may not propagate to it (Prefect configures its own;
`vta_pipeline_details` carries what only a developer reads)."""


def open_run_log(store_root: Path) -> Path:
    """Attach a file handler for this process's run to the loggers above; return its path."""
    d = Path(store_root) / "logs"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    handler = _RunLogHandler(path, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").propagate = False  # in the file, not on the console
    logging.getLogger("vta_pipeline_details").setLevel(logging.INFO)
    for name in LOGGERS:
        _attach(logging.getLogger(name), handler)
    return path


class _RunLogHandler(logging.FileHandler):
    """A file handler that, when the file can no longer be written (a full disk), says so once
    on the console and stops, instead of printing "--- Logging error ---" and a traceback for
    every record that follows (hundreds, burying the one message that says what to do)."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        import sys

        if self.stream is None and getattr(self, "_gave_up", False):
            return
        self._gave_up = True
        err = sys.exc_info()[1]
        try:
            sys.stderr.write(
                f"vta-pipeline: the run log {self.baseFilename} can no longer be written ({err}); "
                "the rest of this run is logged to the console only\n"
            )
        except Exception:  # noqa: BLE001 - stderr gone too: nothing left to tell
            pass
        for logger in (logging.getLogger(n) for n in LOGGERS):
            while logger.propagate and logger.parent is not None:
                logger = logger.parent
            logger.removeHandler(self)
        try:
            self.close()
        except OSError:
            self.stream = None


def _attach(logger: logging.Logger, handler: logging.Handler) -> None:
    """Add `handler` where `logger`'s records stop propagating (once: never twice per record)."""
    while logger.propagate and logger.parent is not None:
        logger = logger.parent
    if handler not in logger.handlers:
        logger.addHandler(handler)
