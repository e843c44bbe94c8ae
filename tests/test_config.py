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


class TestConfigFile:
    """The optional configuration file: found once, read into the variables it sets, laid under the environment."""

    @pytest.fixture(autouse=True)
    def clean(self, tmp_path, monkeypatch):
        for name in (config.CONFIG_FILE, config.DATA_DIR, config.LOKI.url, config.LOKI.password, config.BACKEND):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.chdir(tmp_path)

    @staticmethod
    def stores(tmp_path):
        """Three stores, each with a job named after it: which one a command lists says where its data dir came from."""
        from jobtrace.synth import SynthJob, write_job

        for name in ("from-arg", "from-env", "from-file"):
            write_job(tmp_path / name, SynthJob(job_id=name, ranks=2, steps=3))

    @staticmethod
    def listed(*args, env=None):
        from click.testing import CliRunner

        from jobtrace.cli import main

        res = CliRunner().invoke(main, ["jobs", "--format", "names", *args], env=env)
        assert res.exit_code == 0, res.output
        return res.stdout.split()

    def test_arguments_beat_the_environment_which_beats_the_file(self, tmp_path):
        self.stores(tmp_path)
        (tmp_path / "jobtrace.toml").write_text('data_dir = "from-file"\n')
        assert ["from-file"] == self.listed()
        assert ["from-env"] == self.listed(env={config.DATA_DIR: str(tmp_path / "from-env")})
        assert ["from-arg"] == self.listed("--data-dir", tmp_path / "from-arg",
                                           env={config.DATA_DIR: str(tmp_path / "from-env")})

    def test_an_empty_variable_counts_as_unset_so_the_file_applies(self, tmp_path):
        self.stores(tmp_path)
        (tmp_path / "jobtrace.toml").write_text('data_dir = "from-file"\n')
        assert ["from-file"] == self.listed(env={config.DATA_DIR: ""})

    def test_the_file_is_laid_under_the_environment_only_while_a_command_runs(self, tmp_path):
        import os

        (tmp_path / "jobtrace.toml").write_text('[loki]\nurl = "http://loki:3100"\n')
        settings = config.load_config_file()
        assert {config.LOKI.url: "http://loki:3100"} == dict(settings.values)
        with config.file_layer(settings):
            assert "http://loki:3100" == config.get_str(config.LOKI.url)
        assert config.LOKI.url not in os.environ

    def test_pyproject_tool_table_is_read_and_jobtrace_toml_comes_first(self, tmp_path):
        (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.jobtrace]\nloki_url = "http://a"\n')
        assert {config.LOKI.url: "http://a"} == dict(config.load_config_file().values)
        (tmp_path / "jobtrace.toml").write_text('loki_url = "http://b"\n')
        assert {config.LOKI.url: "http://b"} == dict(config.load_config_file().values)

    def test_a_pyproject_without_the_table_is_no_configuration(self, tmp_path):
        (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
        assert config.FileSettings() == config.load_config_file()

    def test_the_variable_names_the_file_or_none(self, tmp_path, monkeypatch):
        (tmp_path / "jobtrace.toml").write_text('loki_url = "http://here"\n')
        (tmp_path / "elsewhere.toml").write_text('[loki]\nurl = "http://there"\n')
        monkeypatch.setenv(config.CONFIG_FILE, str(tmp_path / "elsewhere.toml"))
        assert {config.LOKI.url: "http://there"} == dict(config.load_config_file().values)
        monkeypatch.setenv(config.CONFIG_FILE, "none")
        assert {} == dict(config.load_config_file().values)
        monkeypatch.setenv(config.CONFIG_FILE, str(tmp_path / "missing.toml"))
        with pytest.raises(ConfigError, match="JOBTRACE_CONFIG=.*no such file"):
            config.load_config_file()

    def test_values_are_spelled_as_the_environment_spells_them(self, tmp_path):
        sub = tmp_path / "conf"
        sub.mkdir()
        (sub / "j.toml").write_text('data_dir = "store"\nlocal = false\nheartbeat_s = 0.5\nloki_batch_lines = 100\n'
                                    '[loki]\nlabels = { cluster = "a", env = "prod" }\n')
        values = config.read_config_file(sub / "j.toml").values
        assert {config.DATA_DIR: str(sub / "store"), config.LOCAL: "0", config.HEARTBEAT_S: "0.5",
                config.LOKI_BATCH_LINES: "100", config.LOKI_LABELS: "cluster=a,env=prod"} == dict(values)
        assert 0.5 == config.get_float(config.HEARTBEAT_S, values)

    @pytest.mark.parametrize("text,message", [
        ('loki_ulr = "x"\n', r"loki_ulr is not a setting jobtrace knows; did you mean 'loki_url'\?"),
        ('rank = 3\n', r"rank is not read from a file \(each process says its own\)"),
        ('config = "x"\n', "config is not read from a file"),
        ('[loki]\nurl = ["a", "b"]\n', "loki.url: expected a string, a number or a boolean"),
        ('data_dir = \n', "is not valid TOML"),
    ])
    def test_a_mistake_names_the_file_and_the_key(self, tmp_path, text, message):
        (tmp_path / "jobtrace.toml").write_text(text)
        with pytest.raises(ConfigError, match=message) as info:
            config.load_config_file()
        assert "jobtrace.toml" in str(info.value)

    def test_a_bad_file_stops_a_command_with_exit_3(self, tmp_path):
        from click.testing import CliRunner

        from jobtrace.cli import main, trace_job

        (tmp_path / "jobtrace.toml").write_text('loki_ulr = "x"\n')
        for cmd, args in ((main, ["jobs"]), (trace_job, ["job"])):
            res = CliRunner().invoke(cmd, args)
            assert 3 == res.exit_code and "loki_ulr" in res.stderr and "Traceback" not in res.stderr

    def test_the_file_reaches_the_readers_of_a_command(self, tmp_path):
        """A command that needs a server URL finds it in the file (here: the error names the file's URL)."""
        from click.testing import CliRunner

        from jobtrace.cli import trace_job

        (tmp_path / "jobtrace.toml").write_text('backend = "loki"\n[loki]\nurl = "http://127.0.0.1:9"\n')
        res = CliRunner().invoke(trace_job, ["job"])
        assert 3 == res.exit_code and "127.0.0.1:9" in res.stderr

    class TestSecrets:
        SECRET = "hunter2-do-not-print"

        def test_a_secret_in_a_file_others_can_read_is_refused_without_showing_it(self, tmp_path):
            path = tmp_path / "jobtrace.toml"
            path.write_text(f'[loki]\npassword = "{self.SECRET}"\n')
            path.chmod(0o644)
            with pytest.raises(ConfigError, match=r"loki.password: a secret in a file others can read; chmod 600") as info:
                config.read_config_file(path)
            assert self.SECRET not in str(info.value)

        def test_a_private_file_may_hold_the_secret(self, tmp_path):
            path = tmp_path / "jobtrace.toml"
            path.write_text(f'[loki]\npassword = "{self.SECRET}"\n')
            path.chmod(0o600)
            values = config.read_config_file(path).values
            assert self.SECRET == config.get_secret(config.LOKI.password, values)

        def test_pyproject_never_holds_a_secret(self, tmp_path):
            path = tmp_path / "pyproject.toml"
            path.write_text(f'[tool.jobtrace]\nes_token = "{self.SECRET}"\n')
            path.chmod(0o600)
            with pytest.raises(ConfigError, match="es_token: a secret in pyproject.toml") as info:
                config.load_config_file()
            assert self.SECRET not in str(info.value)

        def test_a_secret_file_path_is_always_accepted_relative_to_the_file(self, tmp_path):
            (tmp_path / "secrets").mkdir()
            (tmp_path / "secrets" / "loki").write_text(self.SECRET + "\n")
            path = tmp_path / "pyproject.toml"
            path.write_text('[tool.jobtrace.loki]\npassword_file = "secrets/loki"\n')
            path.chmod(0o644)
            values = config.load_config_file().values
            assert self.SECRET == config.get_secret(config.LOKI.password, values)
