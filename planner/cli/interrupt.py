"""Ctrl-C for the `molcap` program: one line on stderr and exit 130, whenever it arrives.

Python turns Ctrl-C into a KeyboardInterrupt raised wherever the main thread happens to be.
Click catches that inside a command and exits 1 with "Aborted!", and anywhere else (imports,
building the command, interpreter exit hooks) it ends as a traceback. So the program replaces
Python's handler: while a command runs, Ctrl-C raises `Interrupted`, which no library catches,
so `finally` clean-ups (stopping workers, removing a half-written temporary file) run and the
program's entry point turns it into the one line. Before a command starts and while cleaning up
after the first Ctrl-C there is nothing to keep, so the line is written and the process ends at
once; once the command has finished, Ctrl-C is ignored (the result is complete and printed).

This module imports nothing heavy: it is installed before the CLI's imports load.
"""

from __future__ import annotations

import os
import signal

INTERRUPTED_EXIT = 130
MESSAGE = "interrupted: what finished is kept (points, samples); run the same command to resume"


class Interrupted(BaseException):
    """Ctrl-C during a command. A BaseException and not a KeyboardInterrupt, so that neither
    `except Exception` nor Click's KeyboardInterrupt handling (exit 1) swallows it."""


def _quit_now(signum, frame) -> None:
    os.write(2, (MESSAGE + "\n").encode())
    os._exit(INTERRUPTED_EXIT)


def _raise_interrupted(signum, frame) -> None:
    signal.signal(signal.SIGINT, _quit_now)  # a second Ctrl-C during the clean-up ends it
    raise Interrupted


def _set(handler) -> None:
    """Install `handler` unless Ctrl-C was ignored when the program started (nohup, a background
    job): then it stays ignored, as Python itself leaves it."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, handler)


def quit_on_ctrl_c() -> None:
    """Until a command starts: Ctrl-C writes the line and ends the process."""
    _set(_quit_now)


def interrupt_on_ctrl_c() -> None:
    """While a command runs: Ctrl-C raises `Interrupted` in the main thread."""
    _set(_raise_interrupted)


def ignore_ctrl_c() -> None:
    """The command has finished: nothing is left to interrupt."""
    _set(signal.SIG_IGN)
