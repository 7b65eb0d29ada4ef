"""Stand-in for qairt.utils.loggers (tests only), behaving as qairt-dev 0.6.0's does: area
loggers with propagate = False and their own StreamHandler on the sys.stdout of import time (the
"extended" format of qairt/logging_config.yaml), and maybe_suppress_stdout, which points fd 1 at
/dev/null unless the given logger is at DEBUG."""
import logging
import os
import sys
from contextlib import contextmanager

EXTENDED = ("%(name)s: %(asctime)s | %(levelname)s | %(funcName)s | %(filename)s:%(lineno)s - "
            "%(message)s")
# logging_config.yaml's areas and levels (a selection)
AREAS = {"qairt.compile": "INFO", "qairt.convert": "WARNING", "qairt.model": "WARNING",
         "qairt.execute": "WARNING", "GenAIBuilder.HTP": "WARNING", "LoraModule": "WARNING",
         # an SDK-internal (qti) area, as QAIRTLogger registers them
         "qti.aisw.converters": "WARNING"}


def _register(name: str, level: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.setLevel(level)
    logger.propagate = False
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(EXTENDED, "%Y-%m-%dT%H:%M:%SZ"))
    logger.addHandler(handler)
    return logger


for _name, _level in AREAS.items():
    _register(_name, _level)


def get_logger(name: str = "", level: str = "INFO") -> logging.Logger:
    return logging.getLogger(name)


@contextmanager
def maybe_suppress_stdout(logger=None, level: int = logging.DEBUG):
    if logger is not None and logger.getEffectiveLevel() <= level:
        yield
        return
    sys.stdout.flush()
    old_fd = os.dup(1)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
        finally:
            os.close(devnull)
        try:
            yield
        finally:
            sys.stdout.flush()
            os.dup2(old_fd, 1)
    finally:
        os.close(old_fd)
