"""SQL literals for the statements DuckDB cannot take parameters in (COPY, CREATE VIEW, file lists).

Every path or setting spliced into SQL goes through here, so a quote in a job id or a
directory name can never end a string early.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["literal", "literal_list"]


def literal(value: str | os.PathLike[str]) -> str:
    """``value`` as a quoted SQL string literal."""
    return "'" + str(value).replace("'", "''") + "'"


def literal_list(values: Iterable[str | os.PathLike[str]]) -> str:
    """``values`` as a SQL list of string literals, e.g. for ``read_parquet([...])``."""
    return "[" + ", ".join(literal(v) for v in values) + "]"
