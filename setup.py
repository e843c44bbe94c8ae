"""The compiled parts (``jobtrace_native``, the Rust crate in ``native/``) as an optional extension of the package.

Everything else about the package is in ``pyproject.toml``; this file says what pyproject cannot. Where no
Rust toolchain is installed (no ``cargo`` or ``rustc`` on ``PATH``), the extension is left out with a one-line
notice instead of setuptools-rust's page of advice, and the Python code does all the work (the lane and the
recorder are optional everywhere they are used). Where one is, ``pip install .`` and ``pip install -e .``
both build it in release mode (setuptools-rust builds an editable install's unoptimised, for debugging,
unless told otherwise; run it again after a change to ``native/``), and a build that fails (no network for
crates.io, say) is reported and skipped. ``JOBTRACE_REQUIRE_NATIVE=1`` (set by CI, which tests the compiled
parts) makes a missing toolchain or a failed build an error.
"""

from __future__ import annotations

import os
import shutil
import sys

from setuptools import setup

REQUIRED = os.environ.get("JOBTRACE_REQUIRE_NATIVE", "") not in ("", "0")
# pip runs this file once per build step; the notice is for the step that builds
BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "install", "develop"}


def toolchain() -> bool:
    """Whether cargo and rustc are on PATH (``CARGO`` names another cargo, as it does for setuptools-rust)."""
    return shutil.which(os.environ.get("CARGO", "cargo")) is not None and shutil.which("rustc") is not None


if toolchain() or REQUIRED:
    from setuptools_rust import Binding, RustExtension

    setup(
        rust_extensions=[RustExtension("jobtrace_native", path="native/Cargo.toml", binding=Binding.PyO3,
                                       debug=False, optional=not REQUIRED)],
        # the crate builds for the stable ABI of Python 3.10 on (pyo3's abi3-py310): one wheel for every version
        options={"bdist_wheel": {"py_limited_api": "cp310"}},
        # An editable install's import finder maps only the names setuptools knows, and setuptools does not know
        # setuptools-rust's extensions: named as a top-level module, the one built in place (next to this file)
        # is found from any directory.
        py_modules=["jobtrace_native"] if "editable_wheel" in sys.argv else [],
    )
else:
    if BUILDS.intersection(sys.argv):
        print("jobtrace: no Rust toolchain (cargo, rustc) found: the compiled parts (jobtrace_native) are skipped "
              "and the Python code is used", file=sys.stderr)
    setup()
