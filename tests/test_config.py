"""One configuration module: every variable declared and documented there, and read nowhere else."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from jobtrace import config
from jobtrace.errors import ConfigError
from tests.layering import PACKAGES, ROOT

TRAINING_SCRIPTS = {"jobtrace/demo/train.py"}
"""User code that jobtrace runs (the demo's training script): it reads the launcher's variables as any script does."""

_NAME = re.compile(r"\bJOBTRACE_[A-Z0-9_]*[A-Z0-9_]")


def _product_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


class TestOneModuleReadsTheEnvironment:
    def test_no_other_module_touches_os_environ_or_getenv(self):
        """Only jobtrace/config.py reads the process environment (others go through its helpers)."""
        found = []
        for path in _product_files():
            if _rel(path) in {"jobtrace/config.py", *TRAINING_SCRIPTS}:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb", "putenv") \
                        and isinstance(node.value, ast.Name) and node.value.id == "os":
                    found.append(f"{_rel(path)}:{node.lineno} os.{node.attr}")
                if isinstance(node, ast.ImportFrom) and node.module == "os" and \
                        any(a.name in ("environ", "getenv", "environb") for a in node.names):
                    found.append(f"{_rel(path)}:{node.lineno} from os import …")
        assert [] == found

    def test_no_other_module_spells_a_variable_name(self):
        """A variable is named through its constant (``config.DATA_DIR``), never by a string of its own."""
        found = []
        for path in _product_files():
            if _rel(path) == "jobtrace/config.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                        re.fullmatch(r"JOBTRACE_[A-Z0-9_]+", node.value):
                    found.append(f"{_rel(path)}:{node.lineno} {node.value!r}")
                if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
                        and str(node.values[0].value).startswith("JOBTRACE_"):
                    found.append(f"{_rel(path)}:{node.lineno} f{node.values[0].value!r}…")
        assert [] == found

    def test_every_variable_named_in_code_or_docs_is_declared(self):
        """A name in a message, a docstring, the README or docs/ is a declared variable (or a group's prefix)."""
        declared = set(config.VARIABLES)
        texts = [*_product_files(), ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
        unknown = set()
        for path in texts:
            for name in _NAME.findall(path.read_text(encoding="utf-8")):
                prefix = name if name.endswith("_") else name + "_"  # JOBTRACE_ES or JOBTRACE_ES_: a group's prefix
                if name in declared or any(d.startswith(prefix) for d in declared):
                    continue
                unknown.add(f"{_rel(path)}: {name}")
        assert set() == unknown


class TestTheReference:
    def test_configuration_page_is_generated_from_the_table(self):
        """docs/configuration.md is what ``python -m jobtrace.config`` writes (regenerate it after a change)."""
        page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
        assert config.markdown() == page

    def test_every_variable_says_what_it_does(self):
        assert all(v.doc and v.group and v.kind for v in config.VARIABLES.values())

    def test_the_page_command_prints_the_page(self):
        out = subprocess.run([sys.executable, "-m", "jobtrace.config"], capture_output=True, text=True, check=True,
                             cwd=ROOT).stdout
        assert config.markdown() == out


class TestTypedReaders:
    @pytest.mark.parametrize("raw,expected", [("1", True), ("TRUE", True), ("yes", True), ("On", True),
                                              ("0", False), ("false", False), ("NO", False), ("off", False)])
    def test_one_boolean_dialect(self, raw, expected):
        assert expected is config.get_bool(config.LOCAL, {config.LOCAL: raw}, default=not expected)

    def test_empty_means_unset_and_junk_is_an_error_naming_the_variable(self):
        assert config.get_bool(config.LOCAL, {config.LOCAL: " "}, default=True) is True
        with pytest.raises(ConfigError, match="JOBTRACE_LOCAL='maybe' is not a boolean"):
            config.get_bool(config.LOCAL, {config.LOCAL: "maybe"})

    def test_numbers_are_checked(self):
        env = {config.HEARTBEAT_S: "0", config.THREADS: "two", config.STALL_DUMP_S: "nan"}
        with pytest.raises(ConfigError, match="JOBTRACE_HEARTBEAT_S='0' must be above 0"):
            config.get_float(config.HEARTBEAT_S, env, positive=True)
        with pytest.raises(ConfigError, match="JOBTRACE_THREADS='two' is not a whole number"):
            config.get_int(config.THREADS, env)
        with pytest.raises(ConfigError, match="not a finite number"):
            config.get_float(config.STALL_DUMP_S, env)

    def test_a_secret_comes_from_its_file_and_errors_never_show_it(self, tmp_path):
        (tmp_path / "pw").write_text("s3cret\n")
        assert "s3cret" == config.get_secret(config.ES.password, {config.ES.password + "_FILE": str(tmp_path / "pw")})
        with pytest.raises(ConfigError) as info:
            config.get_secret(config.ES.password, {config.ES.password + "_FILE": str(tmp_path / "missing"),
                                                   config.ES.password: "s3cret"})
        assert "s3cret" not in str(info.value) and "JOBTRACE_ES_PASSWORD_FILE" in str(info.value)

    def test_tracing_settings_read_once_into_a_frozen_dataclass(self):
        s = config.TracingSettings.from_env({config.HEARTBEAT_S: "2.5", config.LOCAL: "off",
                                             config.LOKI.url: "http://loki:3100"})
        assert (2.5, False, {"loki": "http://loki:3100"}) == (s.heartbeat_s, s.local_store, s.servers)
        with pytest.raises(AttributeError):
            s.heartbeat_s = 1.0  # type: ignore[misc]


class TestTracingHonoursTheSettings:
    def test_an_explicit_zero_heartbeat_is_refused_not_replaced_by_the_default(self, tmp_path):
        import otel_instrumentation as oi

        with pytest.raises(ConfigError, match="heartbeat_s=0 must be above 0"):
            oi.init_tracing("zero-beat", data_dir=str(tmp_path), heartbeat_s=0, torch=False, otel=False)
        assert oi.get_tracing() is None

    def test_disable_installs_nothing_and_writes_nothing(self, tmp_path, monkeypatch):
        import logging

        import otel_instrumentation as oi

        monkeypatch.setenv(config.DISABLE, "1")
        threads, handlers = set(threading.enumerate()), list(logging.getLogger().handlers)
        t = oi.init_tracing("off", data_dir=str(tmp_path), torch=False, otel=False)
        try:
            with oi.step(0), oi.phase("forward"):
                logging.getLogger("x").warning("not recorded")
            oi.log_metrics(0, loss=1.0)
            assert set(threading.enumerate()) == threads
            assert logging.getLogger().handlers == handlers
            assert oi.get_tracing() is None and t.stats() == {"disabled": True}
        finally:
            t.shutdown()
        assert [] == list(tmp_path.iterdir())
