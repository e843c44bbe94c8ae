"""Options more than one command shares: ``--version``, the backend choice (``--backend``, once ``--to``),
renamed options' old spellings, and the job id argument (completed from the embedded store)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final, TypeVar

import click

from jobtrace import config

__all__ = ["BACKENDS", "Duration", "backend_option", "complete_job_ids", "job_id_argument", "renamed_option",
           "version_option", "version_text"]

BACKENDS: Final = ("local", "loki", "victorialogs", "elasticsearch", "archive")
"""Every backend name, in one spelling for every command: each command accepts those that make sense for
it (``watch`` cannot follow an archive, ``export`` sends to servers only), never another spelling of them.
``queries.BACKENDS`` and the shippers' and sinks' names are held to these by tests."""

_F = TypeVar("_F", bound=Callable[..., Any])


def version_text() -> str:
    """The version, and whether the compiled parts (``jobtrace_native``) import: without them the
    recorder and the ingest run their pure-Python paths, slower but the same output."""
    import importlib
    from importlib import metadata

    try:
        release = metadata.version("jobtrace")  # the distribution's (the facade is a peer of the CLI's layer)
    except metadata.PackageNotFoundError:
        release = "(not installed)"
    try:
        jobtrace_native = importlib.import_module("jobtrace_native")  # untyped, and absent where not built
    except ImportError as exc:
        native = f"absent ({exc}; the pure-Python recorder and ingest are used)"
    else:
        parts = [name for name in ("Recorder", "FastLane") if hasattr(jobtrace_native, name)]
        version = getattr(jobtrace_native, "__version__", "unknown version")
        native = f"present (jobtrace_native {version}: {', '.join(parts) or 'no known part'})"
    return f"jobtrace {release}\ncompiled parts: {native}"


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(version_text())
        ctx.exit(0)


def version_option(f: _F) -> _F:
    """``--version``: print :func:`version_text` and exit 0."""
    return click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
                        help="Print the version and whether the compiled parts are installed, and exit.")(f)


def renamed_option(new: str, old: str, dest: str, *, required: bool = False, **kwargs: Any) -> Callable[[_F], _F]:
    """Option ``new`` (which the command gets as ``dest``), with ``old``, its former spelling, kept working:
    hidden from ``--help``, and a warning on stderr each time it is used, so that scripts keep running
    while they are updated (the way ``kubectl`` and ``gh`` retire flags).

    Giving both with different values is a usage error. ``required`` is checked here: with two
    spellings neither can be required to click. ``kwargs`` go to both options (type, choices) and
    ``envvar``/``help``/``show_default`` to ``new`` only; the command line beats the variable
    whichever spelling it uses.
    """
    old_dest = f"_old_{dest}"
    shared = {k: v for k, v in kwargs.items() if k in ("type", "metavar")}

    def decorate(f: _F) -> _F:
        @functools.wraps(f)
        def merged(*args: Any, **kw: Any) -> Any:
            value, old_value = kw.get(dest), kw.pop(old_dest, None)
            if old_value is not None:
                click.echo(f"warning: {old} is deprecated (it still works, for now): use {new}", err=True)
                ctx = click.get_current_context()
                from_line = ctx.get_parameter_source(dest) == click.core.ParameterSource.COMMANDLINE
                if from_line and value is not None and value != old_value:
                    raise click.UsageError(f"{old} is the old spelling of {new}: give one, not {new} {value} "
                                           f"and {old} {old_value}")
                value = old_value
            if value is None and required:
                raise click.MissingParameter(param_type="option", param_hint=f"'{new}'")
            kw[dest] = value
            return f(*args, **kw)

        wrapped = click.option(old, old_dest, default=None, hidden=True, **shared)(merged)
        own = dict(kwargs)
        if required and own.get("help"):
            own["help"] = f"{own['help']}  [required]"
        return click.option(new, dest, **own)(wrapped)  # type: ignore[return-value]

    return decorate


def backend_option(choices: tuple[str, ...], *, default: str | None, help: str,  # noqa: A002 - click's name
                   envvar: str | None = None) -> Callable[[_F], _F]:
    """``--backend`` (the one spelling of the backend choice), with ``--to`` kept as a deprecated hidden alias
    (:func:`renamed_option`). The command gets ``backend``. Without ``default`` it is required.

    ``choices`` are names of :data:`BACKENDS`; ``envvar`` lets a variable (``JOBTRACE_BACKEND``) choose.
    """
    unknown = set(choices) - set(BACKENDS)
    if unknown:
        raise ValueError(f"not backend names: {sorted(unknown)}")  # a programming error, caught by the tests
    extra: dict[str, Any] = {"envvar": envvar} if envvar else {}
    return renamed_option("--backend", "--to", "backend", required=default is None, type=click.Choice(choices),
                          default=default, show_default=default or False, help=help, **extra)


def complete_job_ids(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[Any]:
    """Shell completion of a job id: the jobs of the embedded store the command would read.

    Its ``--data-dir`` when already typed, else ``JOBTRACE_DATA_DIR`` (or the configuration
    file's), else the default. Only for the local store: asking a server on every Tab would
    be slow, and would need its credentials in the shell.
    """
    from click.shell_completion import CompletionItem

    from jobtrace.store import DEFAULT_DATA_DIR, list_jobs

    if ctx.params.get("backend") not in (None, "local"):
        return []
    data_dir = ctx.params.get("data_dir") or config.get_str(config.DATA_DIR) or DEFAULT_DATA_DIR
    try:
        names = list_jobs(data_dir)
    except OSError:
        return []  # completion never fails loudly: the command will say what is wrong
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]


def job_id_argument(f: _F) -> _F:
    """The ``JOB_ID`` argument, completed from the embedded store (:func:`complete_job_ids`)."""
    return click.argument("job_id", shell_complete=complete_job_ids)(f)


class Duration(click.ParamType):  # type: ignore[type-arg]  # (generic only from click 8.2)
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` (or plain seconds) as seconds (:func:`jobtrace.config.parse_duration_s`)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            seconds = config.parse_duration_s(str(value))
        except ValueError:
            self.fail(f"{value!r}: expected a duration such as 90s, 30m, 12h, 7d or 2w", param, ctx)
        if not seconds > 0:
            self.fail(f"{value!r}: must be above zero", param, ctx)
        return seconds
