"""The command line. Only this package prints.

Each command builds a request, hands it to the pipeline, and renders the report it gets back.
`main` catches only DsparkPatchError (one clean line, its exit code); anything else is a bug.
"""

from __future__ import annotations

import signal
import sys
from typing import Annotated, NoReturn

import typer

from .. import __version__, termination
from ..errors import DsparkPatchError
from . import apply as apply_cmd
from . import evaluate as evaluate_cmd
from . import output
from . import patches as patches_cmd
from . import port as port_cmd
from . import publish as publish_cmd
from . import reference as reference_cmd
from . import report as report_cmd
from . import status as status_cmd
from . import verify as verify_cmd
from .output import error_line

app = typer.Typer(
    name="dspark-patch",
    help="Put a reviewed patch into the vLLM inside an image or a site-packages tree: "
    "exactly (zero fuzz, known hashes), verifiably, with an audit report.\n\n"
    "Exit codes: 0 success (also: already applied), 1 a check failed, 2 bad input, 3 environment problem.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)



def _print_version(value: bool) -> None:
    if value:
        output.line(f"dspark-patch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Options that come before the command."""


for module in (apply_cmd, verify_cmd, status_cmd, publish_cmd, patches_cmd, port_cmd, report_cmd, reference_cmd, evaluate_cmd):
    module.register(app)


def _interrupted(signum: int, frame: object) -> None:
    """Ctrl-C as Python's own handler has it (KeyboardInterrupt), and remembered: raised inside
    a finaliser, the exception is dropped, and the run's next step stops it (termination.py)."""
    termination.record(signum)
    raise KeyboardInterrupt


def main() -> None:
    # A SIGINT the shell ignores (a background job) stays ignored; so does an ignored SIGTERM.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)
    # SIGTERM (a CI job's cancel, `docker stop`, `kill`) unwinds the run as Ctrl-C does, on every
    # command and target: a local tree's write is rolled back, containers are removed, nothing is
    # tagged, and the exit code is 143 (128 + 15). Where the tool holds containers, their own
    # handlers (targets/docker/signals.py) take over while they do and give this one back.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, termination.stop)
    # Standalone mode: click prints usage errors itself (exit 2) and exits with typer.Exit codes.
    try:
        app()
    except DsparkPatchError as exc:
        error_line(exc)
        _end(exc.exit_code)
    except KeyboardInterrupt:
        output.line("dspark-patch: interrupted; nothing was committed", err=True)
        _end(130)
    except SystemExit as exc:
        if exc.code == 130:  # typer turns Ctrl-C (KeyboardInterrupt) into Exit(130) before it reaches here
            output.line("dspark-patch: interrupted; nothing was committed", err=True)
        elif exc.code == 143 and termination.received() == signal.SIGTERM:
            output.line("dspark-patch: terminated; nothing was committed", err=True)
        if exc.code is None or isinstance(exc.code, int):
            _end(exc.code or 0)
        raise
    _end(0)


def _end(code: int) -> NoReturn:
    """Exit with `code` once the work is done: the exit handlers run (temporary folders, logging)
    and the streams are flushed, then the process ends without the interpreter's teardown of
    every module and object (0.1-0.2 s of each command, all of it after the report). Only when
    this is the last thread: anything still running ends the ordinary way, joined."""
    import atexit
    import os
    import threading

    if threading.active_count() > 1:
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)  # a closed pipe: the ordinary exit says so as before
    os._exit(code)
