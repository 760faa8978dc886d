"""env.isolation=process: a crashing or hanging environment fails one episode, not the run."""

from __future__ import annotations

import asyncio
import os

import pytest

from cadence.envs import EnvConfig, EnvRunner

FRAGILE = """
import os, signal, time

class Fragile:
    action_tag = None

    def reset(self, seed):
        return f"pid {os.getpid()}", {"pid": os.getpid()}

    def step(self, action):
        if action == "exit":
            os._exit(3)
        if action == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if action == "hang":
            time.sleep(60)
        if action == "raise":
            raise KeyError("missing")
        return action, 1.0, True, False, {}
"""


@pytest.fixture
def fragile(tmp_path):
    path = tmp_path / "fragile.py"
    path.write_text(FRAGILE)
    return EnvConfig(name=f"python:{path}:Fragile", isolation="process", step_timeout_s=20)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a killed child not yet reaped is a zombie: not alive either
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


def test_crashes_are_died_failures_and_the_next_episode_gets_a_new_process(fragile):
    async def main():
        runner = EnvRunner.from_config(fragile)
        first = await runner.reset(0)
        assert first.info["pid"] != os.getpid()  # the env lives in a child process
        assert (await runner.step("fine")).observation == "fine"
        pids = {first.info["pid"]}
        for action, code in (("exit", "3"), ("segfault", "-11")):
            again = await runner.reset(0)
            pids.add(again.info["pid"])
            failure = await runner.step(action)
            assert (failure.kind, failure.during) == ("died", "step")
            assert f"exit code {code}" in failure.message
        raised = await runner.reset(0)
        pids.add(raised.info["pid"])
        failure = await runner.step("raise")
        assert failure.kind == "raised" and "KeyError" in failure.message
        # one process for the first env, a new one after each crash
        assert len(pids) == 3 and runner.counts["failures/died"] == 2
        await runner.close()

    asyncio.run(main())


def test_a_hung_step_times_out_and_its_process_is_killed(fragile):
    async def main():
        runner = EnvRunner.from_config(fragile)
        pid = (await runner.reset(0)).info["pid"]
        runner.step_timeout_s = 1.0  # the hang never ends by itself: any limit ends it
        failure = await runner.step("hang")
        assert failure.kind == "timeout"
        for _ in range(100):  # killed by close(), which runs in a thread of its own
            if not alive(pid):
                break
            await asyncio.sleep(0.05)
        assert not alive(pid)
        runner.step_timeout_s = 20
        assert (await runner.reset(1)).info["pid"] != pid

    asyncio.run(main())


def test_a_process_env_that_cannot_be_built_is_a_make_failure(tmp_path):
    path = tmp_path / "needs_arg.py"
    path.write_text(FRAGILE + "\nclass NeedsArg(Fragile):\n    def __init__(self, size):\n"
                    "        raise RuntimeError(f'bad size {size}')\n")  # fmt: skip
    cfg = EnvConfig(name=f"python:{path}:NeedsArg", kwargs={"size": 3}, isolation="process")

    async def main():
        failure = await EnvRunner.from_config(cfg).reset(0)
        assert (failure.kind, failure.during) == ("raised", "make")
        assert "bad size 3" in failure.message

    asyncio.run(main())


def test_builtin_env_in_a_process_with_latency():
    cfg = EnvConfig(name="sokoban", isolation="process", latency={"mean_s": 0.001})

    async def main():
        runner = EnvRunner.from_config(cfg)
        first = await runner.reset(2)
        assert "Sokoban" in first.observation and type(runner.env).__name__ == "LatencyEnv"
        assert (await runner.step("<answer>Up</answer>")).observation.startswith("#")
        await runner.close()

    asyncio.run(main())
