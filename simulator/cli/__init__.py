"""Command-line interface: ``disagg-sim COMMAND``.

Exit codes: 0 success, 2 bad input (a scenario, sweep or data file is wrong), 1 the
simulation itself failed. Bad input prints one line naming the file and key, never a
traceback.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from simulator.cli import (  # noqa: F401  (registers commands)
    compare_cmd,
    init_cmd,
    plan_cmd,
    plot_cmd,
    profiles_cmd,
    report_cmd,
    run_cmd,
    schema_cmd,
    sweep_cmd,
    validate_cmd,
)
from simulator.cli.app import app
from simulator.errors import EXIT_INTERRUPTED, EXIT_SIM_FAILURE, InterruptedRunError, SimulatorError

if TYPE_CHECKING:
    import click


def main(argv: list[str] | None = None, command: click.Command | None = None) -> None:
    """Run the CLI and map every failure to its exit code and one line on stderr.

    ``command`` is the click command built from ``app``; it is built here unless given
    (callers that invoke the CLI many times in one process build it once with
    ``typer.main.get_command(app)``).
    """
    try:
        if command is None:
            app(args=argv, standalone_mode=True)
        else:
            command.main(args=argv, standalone_mode=True)
    except InterruptedRunError as exc:  # Ctrl-C or SIGTERM, after saving what was done
        sys.stderr.write(f"{_one_line(str(exc))}\n")
        sys.exit(exc.exit_code)
    except SimulatorError as exc:
        sys.stderr.write(f"error: {_one_line(str(exc))}\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # a bug: say so in one line, keep the details available
        sys.stderr.write(f"internal error: {type(exc).__name__}: {_one_line(str(exc))} "
                         "(set DISAGG_SIM_DEBUG=1 for the traceback)\n")
        import os

        if os.environ.get("DISAGG_SIM_DEBUG"):
            raise
        sys.exit(EXIT_SIM_FAILURE)


def _one_line(text: str) -> str:
    return " ".join(text.split())


__all__ = ["app", "main"]
