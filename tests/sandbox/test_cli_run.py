"""`cadence sandbox run -- CMD`: output, stdin and exit code passed through; limits; errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
from types import SimpleNamespace

from typer.testing import CliRunner

from cadence.sandbox.cli import app
from tests.sandbox.conftest import needs_bwrap

pytestmark = needs_bwrap


def cadence(*args: str, stdin: str = "") -> SimpleNamespace:
    """In process (the `cadence` entry point imports torch: seconds per call on 2 cores)."""
    r = CliRunner().invoke(app, list(args), input=stdin)
    return SimpleNamespace(stdout=r.stdout, stderr=r.stderr, returncode=r.exit_code)


def test_entry_point_passes_stdio_and_exit_code_through():
    r = subprocess.run([sys.executable, "-m", "cadence", "sandbox", "run", "--", "sh", "-c",
                        "tr a-z A-Z; echo oops >&2; exit 7"], input="hello\n",
                       capture_output=True, text=True, timeout=120)
    assert (r.stdout, r.stderr, r.returncode) == ("HELLO\n", "oops\n", 7)


def test_run_reports_a_limit_and_is_isolated():
    r = cadence("run", "--wall-s", "1", "--", "python3", "-c", "while True: pass")
    assert r.returncode == 137 and "wall limit hit" in r.stderr
    r = cadence("run", "--", "sh", "-c", "id -u; ls /root /work 2>&1 | wc -l")
    assert r.stdout.split()[0] == "65534" and r.returncode == 0
    assert "No such file" in cadence("run", "--", "ls", __file__).stderr


def test_run_errors_are_one_line():
    r = cadence("run")
    assert r.returncode == 2 and "give one after --" in r.stderr and "Traceback" not in r.stderr
    r = cadence("run", "--memory-mb", "0", "--", "true")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "memory_mb" in r.stderr
    for flag, value, field in [("--cpu-s", "inf", "cpu_s"), ("--wall-s", "1e308", "wall_s"), ("--cpus", "0", "cpus")]:
        r = cadence("run", flag, value, "--", "true")
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and field in r.stderr, (flag, r.stderr)


def test_run_python_packages_choice():
    r = cadence("run", "--", "python3", "-c", "import numpy, sys; print(sys.prefix)")
    assert r.returncode == 0, r.stderr
    r = cadence("run", "--python-packages", "none", "--", "python3", "-c", "import numpy")
    assert r.returncode == 1 and "No module named 'numpy'" in r.stderr
    r = cadence("run", "--python-packages", "some", "--", "true")
    assert r.returncode == 2 and "python_packages" in r.stderr and "Traceback" not in r.stderr


def test_run_and_serve_take_dev_tools(monkeypatch):
    """`--dev-tools` shows the host's compilers to `run`, and reaches the service's PoolConfig."""
    look = "command -v gcc || echo none"
    assert cadence("run", "--", "sh", "-c", look).stdout == "none\n"
    if shutil.which("gcc") == "/usr/bin/gcc":
        assert cadence("run", "--dev-tools", "--", "sh", "-c", look).stdout == "/usr/bin/gcc\n"
    from cadence.sandbox import server

    seen = []
    monkeypatch.setattr(server, "serve", lambda cfg, *a: seen.append(cfg.dev_tools))
    for flags in ([], ["--dev-tools"]):
        assert cadence("serve", "--events", ":memory:", *flags).returncode == 0
        server.main(["--events", ":memory:", *flags])
    assert seen == [False, False, True, True]
