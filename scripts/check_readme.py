"""Run the README's commands in order, as a new user would: a fresh clone, a fresh virtualenv.

    python scripts/check_readme.py                     # clone HEAD into a temp folder and run them
    python scripts/check_readme.py --list              # only print the commands and how each is run
    python scripts/check_readme.py --pip-first torch==2.13.0 --out /tmp/readme.json
    python scripts/check_readme.py --fast ...          # a busy machine: the quick start shortened too

Every line of the README's ```bash blocks is taken in order. The install lines run
as written (in the clone, with `.venv` created by the README's own line; `--pip-first`
installs a package into it before them, e.g. a CPU torch the machine already has).
`cadence` lines run as written, except where a run is long: those get overrides
appended (a later override wins), listed in SHORTENED and printed. `cadence
dashboard` is a server: it is started, must answer HTTP on its address, then is
stopped. The test-suite lines (pytest) are not run here: they are CI's job.
Writes a JSON report (command, how it ran, exit code, seconds, last lines).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# README command (exact line) -> overrides appended so that the check takes minutes, not hours.
SHORTENED = {
    "cadence train --config examples/frozenlake.yaml": "trainer.steps=4 eval.every=2 eval.episodes=16",
    "cadence train reward.name=python:examples/rewards/close_enough.py:score": "trainer.steps=10",
    "cadence train runtime.kind=ray rollout.async_ratio=2": "trainer.steps=10",
    "cadence train --config examples/frozenlake.yaml trainer.steps=50 rollout.group_size=4 algorithm.loss=cispo":
        "trainer.steps=4 eval.every=2 eval.episodes=16",
}
# With --fast (a busy machine): the quick start and its resume shortened too.
FAST = {
    "cadence train": "trainer.steps=30",
    "cadence train --resume trainer.steps=250 --allow-change trainer.steps": "trainer.steps=40",
}
# README command -> text its output must contain (what the README says it shows).
EXPECT = {
    "cadence train": "held-out pass@1 after",
    "cadence train --resume trainer.steps=250 --allow-change trainer.steps": "resuming the latest run",
    "cadence train env.name=python:examples/envs/guess_number.py:GuessNumber env.kwargs.high=50 trainer.steps=5":
        "no learning signal in the first 3 steps",
    "cadence envs": "neighbours=False",
}
SERVERS = {"cadence dashboard": "http://127.0.0.1:8484/"}


@dataclass
class Step:
    command: str  # as the README writes it
    kind: str  # install | cadence | server | tests
    run: str = ""  # what is run (the command plus any shortening overrides)
    expect: str | None = None
    returncode: int | None = None
    seconds: float | None = None
    ok: bool | None = None
    tail: list[str] = field(default_factory=list)


def readme_commands(text: str) -> list[str]:
    """Every command line of the README's ```bash blocks, in order (comments and blank lines left out)."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def plan(commands: list[str], fast: bool = False) -> list[Step]:
    """How each README command is checked."""
    shortened = {**SHORTENED, **(FAST if fast else {})}
    steps = []
    for command in commands:
        if "pytest" in command:
            steps.append(Step(command, "tests"))
        elif command in SERVERS:
            steps.append(Step(command, "server", command))
        elif command.startswith("cadence "):
            extra = shortened.get(command)
            steps.append(Step(command, "cadence", f"{command} {extra}" if extra else command, EXPECT.get(command)))
        else:
            steps.append(Step(command, "install", command))
    return steps


def _shell(command: str, cwd: Path, env: dict, timeout: float) -> tuple[int, str]:
    """Run one line in bash with the clone's venv active (the README's `. .venv/bin/activate`)."""
    venv = cwd / ".venv" / "bin" / "activate"
    line = f". {venv} && {command}" if venv.exists() else command
    proc = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout)
    return proc.returncode, proc.stdout


def _serve_once(command: str, url: str, cwd: Path, env: dict, timeout: float) -> tuple[int, str]:
    """Start a server command, wait until `url` answers 200, stop it; 0 if it answered."""
    line = f". {cwd / '.venv' / 'bin' / 'activate'} && exec {command}"
    proc = subprocess.Popen(["bash", "-c", line], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    code = 1
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    code = 0 if reply.status == 200 else 1
                    break
            except OSError:
                time.sleep(0.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as the README says
        out, _ = proc.communicate(timeout=30)
    return code, out + (f"\n{url} answered 200" if code == 0 else f"\n{url} never answered")


def run_all(steps: list[Step], clone: Path, timeout: float, pip_first: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    for step in steps:
        if step.kind == "tests":
            print(f"-- skipped (the test suite is CI's job): {step.command}", flush=True)
            continue
        print(f"-- {step.run}", flush=True)
        t0 = time.perf_counter()
        try:
            if step.kind == "server":
                code, out = _serve_once(step.run, SERVERS[step.command], clone, env, timeout=120)
            else:
                code, out = _shell(step.run, clone, env, timeout)
        except subprocess.TimeoutExpired as err:
            code, out = 124, (err.output or "") if isinstance(err.output, str) else ""
        step.seconds = round(time.perf_counter() - t0, 1)
        step.returncode = code
        step.tail = out.strip().splitlines()[-15:]
        step.ok = code == 0 and (step.expect is None or step.expect in out)
        print(f"   {'ok' if step.ok else 'FAILED'} (exit {code}, {step.seconds} s)", flush=True)
        if step.command.startswith("python -m venv") and pip_first and step.ok:
            code, out = _shell(f"pip install -q {' '.join(map(shlex.quote, pip_first))}", clone, env, timeout)
            print(f"   pip install {' '.join(pip_first)}: exit {code}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the plan only")
    ap.add_argument("--source", default=str(ROOT), help="repository to clone (its HEAD)")
    ap.add_argument("--workdir", default=None, help="where the clone goes (default: a new temp folder)")
    ap.add_argument("--pip-first", nargs="*", default=[], help="packages installed into the venv first")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one command may take")
    ap.add_argument("--out", default=None, help="write the JSON report here")
    ap.add_argument("--fast", action="store_true", help="shorten the quick start and its resume too (FAST)")
    args = ap.parse_args()

    steps = plan(readme_commands((Path(args.source) / "README.md").read_text()), args.fast)
    if args.list:
        for s in steps:
            print(f"{s.kind:8} {s.run or s.command}")
        return 0
    work = Path(args.workdir or tempfile.mkdtemp(prefix="cadence-readme-"))
    clone = work / "cadence"
    subprocess.run(["git", "clone", "-q", args.source, str(clone)], check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    print(f"fresh clone of {args.source} at {head} in {clone}", flush=True)
    t0 = time.time()
    run_all(steps, clone, args.timeout, args.pip_first)
    failed = [s.command for s in steps if s.ok is False]
    report = {"source": args.source, "commit": head, "fast": args.fast, "clone": str(clone), "seconds": round(time.time() - t0),
              "load_average": os.getloadavg(), "failed": failed, "steps": [asdict(s) for s in steps]}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"{len(steps) - len(failed)} of {len(steps)} README commands passed or were skipped; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
