"""``python -m jobtrace.cli``: the ``jobtrace`` command."""

from __future__ import annotations

from . import main

main(prog_name="jobtrace")
