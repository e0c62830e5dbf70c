"""Errors a user can act on, and the CLI exit codes that go with them.

Every error raised for bad input carries the file, the key path inside it and what is
allowed, so the CLI can print one line instead of a traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_SIM_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM


class SimulatorError(Exception):
    """Base class of every error the simulator raises on purpose."""

    exit_code = EXIT_SIM_FAILURE


class ConfigError(SimulatorError):
    """A scenario, sweep, profile or data file is wrong.

    ``file`` is the offending file (or ``None`` for objects built in code), ``key`` the
    dotted key path inside it, ``message`` what is wrong and what is allowed.
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None):
        self.file = file
        self.key = key
        self.message = message
        super().__init__(self.one_line())

    def one_line(self) -> str:
        parts = [p for p in (self.file, self.key) if p]
        return ": ".join([*parts, self.message])

    def with_file(self, file: str) -> ConfigError:
        """The same error, attributed to ``file`` when it had no file yet."""
        if self.file is not None:
            return self
        return ConfigError(self.message, file=file, key=self.key)


class MemoryFitError(ConfigError):
    """A model (or its KV cache) does not fit the devices it was given."""


class SimulationError(SimulatorError):
    """The simulation itself failed (a bug, or a state the model cannot represent)."""


class InterruptedRunError(SimulatorError):
    """Ctrl-C or SIGTERM stopped a command after it saved what was done.

    ``str()`` says what was kept and how to resume; ``exit_code`` is 130 or 143. It is an
    ``Exception``, not a ``KeyboardInterrupt``, so the CLI framework (which turns a
    ``KeyboardInterrupt`` into a silent exit 130) lets the message through.
    """

    def __init__(self, message: str = "interrupted", exit_code: int = EXIT_INTERRUPTED):
        super().__init__(message)
        self.exit_code = exit_code
