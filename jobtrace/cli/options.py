"""Options more than one command shares: ``--version`` and the backend choice (``--backend``, once ``--to``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from jobtrace import config

__all__ = ["backend_option", "version_option", "version_text"]

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


def backend_option(choices: tuple[str, ...], *, default: str | None, help: str) -> Callable[[_F], _F]:  # noqa: A002 - click's name
    """``--backend`` (the one spelling of the backend choice), with ``--to`` kept as a hidden alias
    so that scripts written for the old spelling keep running. The command gets ``backend``.

    Without ``default`` the option is required (checked here: with two spellings neither can be
    required to click).
    """
    def decorate(f: _F) -> _F:
        @functools.wraps(f)
        def merged(*args: Any, backend: str | None, old_to: str | None, **kwargs: Any) -> Any:
            if backend and old_to and backend != old_to:
                raise click.UsageError(f"--to is the old spelling of --backend: give one, not --backend {backend} "
                                       f"and --to {old_to}")
            chosen = backend or old_to or default
            if chosen is None:
                raise click.MissingParameter(param_type="option", param_hint="'--backend'")
            return f(*args, backend=chosen, **kwargs)

        wrapped = click.option("--to", "old_to", type=click.Choice(choices), default=None, hidden=True)(merged)
        return click.option("--backend", type=click.Choice(choices), default=None,
                            show_default=default or False,
                            help=help if default else f"{help}  [required]")(wrapped)  # type: ignore[return-value]

    return decorate


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
