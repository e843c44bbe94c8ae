"""The exit codes of every jobtrace command, and the one place that maps errors to them.

    0    healthy, or done: no problem found, everything sent
    1    problem found: a slow, stalled or silent rank, NaN loss; something left unsent; a refusal
         (:class:`~jobtrace.errors.Refused`, e.g. an unhealthy job offered as a golden run)
    2    usage error: a bad option or argument (click's usage errors, and option values the commands
         check, such as ``--since``)
    3    error: any :class:`~jobtrace.errors.JobtraceError` (a bad variable or missing URL, job not
         found, store unreadable, backend unreachable or refusing)
    4    internal error: any other exception, that is a bug; one line naming it, and with ``--debug``
         the traceback
    130  interrupted (Ctrl-C)

A configuration file that cannot be used (bad TOML, an unknown key, a secret in a file
others can read: :func:`jobtrace.config.read_config_file`) is an error too, 3, before any
command runs.

So a CI gate can tell a finding (1) from a crash (4) or a broken setup (2, 3). Commands end
with :func:`finish` (0 or 1 from what they found) or let an exception out; :class:`Command`
and :class:`Group` turn it into its code here, so no command calls ``sys.exit`` or catches
errors to pick a code itself. ``--debug`` is an option of every command and of the group.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import Any, Final, NoReturn, TypeVar

import click

from jobtrace import config
from jobtrace.errors import ConfigError, JobtraceError, Refused

__all__ = [
    "EXIT_ERROR",
    "EXIT_HEALTHY",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_PROBLEM",
    "EXIT_USAGE",
    "Command",
    "Group",
    "exit_code_for",
    "finish",
]

EXIT_HEALTHY: Final = 0
EXIT_PROBLEM: Final = 1
EXIT_USAGE: Final = 2
EXIT_ERROR: Final = 3
EXIT_INTERNAL: Final = 4
EXIT_INTERRUPTED: Final = 130

_BY_CLASS: Final[tuple[tuple[type[JobtraceError], int], ...]] = (
    (Refused, EXIT_PROBLEM),
    (JobtraceError, EXIT_ERROR),
)
"""The exception tree's codes, most specific class first (the first match wins)."""

_DEBUG: Final = "jobtrace.debug"
"""Key in ``ctx.meta`` (shared by a group's context and its command's) set by ``--debug``."""

_T = TypeVar("_T")


def exit_code_for(exc: BaseException) -> int:
    """The exit code an exception ends a command with."""
    if isinstance(exc, click.exceptions.Exit):
        return exc.exit_code
    if isinstance(exc, click.UsageError):
        return EXIT_USAGE
    if isinstance(exc, click.ClickException):
        return EXIT_ERROR if exc.exit_code == EXIT_PROBLEM else exc.exit_code  # FileError and the like
    if isinstance(exc, (KeyboardInterrupt, click.Abort)):
        return EXIT_INTERRUPTED
    for cls, code in _BY_CLASS:
        if isinstance(exc, cls):
            return code
    return EXIT_INTERNAL


def finish(ok: bool) -> NoReturn:
    """End a command that ran to its end: 0 when ``ok`` (healthy, all done), else 1 (problem found)."""
    raise click.exceptions.Exit(EXIT_HEALTHY if ok else EXIT_PROBLEM)


def _exception_name(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _report(exc: Exception, code: int, debug: bool) -> None:
    """Say what went wrong on stderr: the message, or for a bug one line naming it (the traceback with --debug)."""
    if debug:
        click.echo("".join(traceback.format_exception(exc)), err=True, nl=False)
    label = click.style("error:", fg="red", bold=True)
    if code != EXIT_INTERNAL:
        click.echo(f"{label} {exc}", err=True)
        return
    lines = str(exc).strip().splitlines()
    what = _exception_name(exc) + (f": {lines[0]}" if lines else "")
    hint = "" if debug else "; rerun with --debug for the traceback"
    click.echo(f"{label} internal error (a bug in jobtrace): {what}{hint}", err=True)


def _run_mapped(ctx: click.Context, invoke: Callable[[click.Context], _T]) -> _T:
    """``invoke(ctx)``, with every exception but click's own turned into its exit code (after saying why)."""
    try:
        return invoke(ctx)
    except (click.exceptions.Exit, click.Abort, click.UsageError):
        raise
    except click.ClickException as exc:  # a FileError, say: its own message, but never 1 ("problem found")
        exc.show()
        raise click.exceptions.Exit(exit_code_for(exc)) from None
    except KeyboardInterrupt:
        click.echo(err=True)  # closes the terminal's ^C
        raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
    except Exception as exc:  # noqa: BLE001 - this is the one place that maps them all
        code = exit_code_for(exc)
        _report(exc, code, bool(ctx.meta.get(_DEBUG)))
        raise click.exceptions.Exit(code) from None


def _main_with_file(main: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run a command's ``main`` with the configuration file laid under the environment
    (:func:`jobtrace.config.file_layer`): the one place the file reaches every option and reader."""
    try:
        settings = config.load_config_file()
    except ConfigError as exc:
        if not kwargs.get("standalone_mode", True):
            raise
        click.echo(f"{click.style('error:', fg='red', bold=True)} {exc}", err=True)
        sys.exit(EXIT_ERROR)
    with config.file_layer(settings):
        return main(*args, **kwargs)


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_DEBUG] = True


def _debug_option() -> click.Option:
    return click.Option(["--debug"], is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
                        help="On an error, print the traceback too.")


class Command(click.Command):
    """A command whose errors end in the exit codes above, with ``--debug``, and that reads the configuration file."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(_debug_option())

    def main(self, *args: Any, **kwargs: Any) -> Any:
        return _main_with_file(super().main, args, kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        return _run_mapped(ctx, super().invoke)


class Group(click.Group):
    """The ``jobtrace`` group: ``--debug`` before the command name, and the same mapping for what the
    commands' own does not see (an error while a command's options are read)."""

    command_class = Command

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(_debug_option())

    def main(self, *args: Any, **kwargs: Any) -> Any:
        return _main_with_file(super().main, args, kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        return _run_mapped(ctx, super().invoke)
