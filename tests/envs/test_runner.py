"""EnvRunner: one async interface over sync and async envs; failures cost one episode only."""

from __future__ import annotations

import asyncio
import threading

import pytest

from cadence.envs import EnvDied, EnvFailure, EnvRunner, ResetResult, StepResult


class Counter:
    """Counts to a target: action 'up' adds one; reward 1 at the target."""

    made = 0
    gate = threading.Event()  # action "wait" blocks on it

    def __init__(self, target: int = 2) -> None:
        type(self).made += 1
        self.target, self.value, self.closed = target, 0, False
        self.threads: set[str] = set()

    def reset(self, seed: int):
        self.threads.add(threading.current_thread().name)
        self.value = seed
        return f"at {self.value}", {"seed": seed}

    def step(self, action: str):
        self.threads.add(threading.current_thread().name)
        if action == "boom":
            raise ValueError("exploded")
        if action == "hang":
            threading.Event().wait(60)
        if action == "die":
            raise EnvDied("backend process exited")
        if action == "bad":
            return "only", 1.0
        if action == "exit":
            raise SystemExit(4)
        if action == "wait":
            assert self.gate.wait(30)
        self.value += action == "up"
        done = self.value >= self.target
        return f"at {self.value}", float(done), done, False, {}

    def close(self) -> None:
        self.closed = True


class AsyncCounter:
    def __init__(self) -> None:
        self.value = 0

    async def reset(self, seed: int):
        self.value = seed
        return f"at {seed}", {}

    async def step(self, action: str):
        if action == "hang":
            await asyncio.Event().wait()
        self.value += 1
        return f"at {self.value}", 0.0, False, False, {"n": self.value}


def run(coro):
    return asyncio.run(coro)


def test_sync_episode_runs_in_the_runners_thread_and_ends_with_the_reward():
    async def main():
        runner = EnvRunner(Counter, action_tag="answer")
        first = await runner.reset(0)
        assert first == ResetResult("at 0", {"seed": 0})
        one = await runner.step("thinking... <answer>down</answer> no, <answer> up </answer>")
        assert (one.observation, one.reward, one.done, one.action) == ("at 1", 0.0, False, "up")
        two = await runner.step("<answer>up</answer>")
        assert (two.reward, two.terminated, two.truncated) == (1.0, True, False)
        env = runner.env
        assert env.threads and threading.current_thread().name not in env.threads
        with pytest.raises(RuntimeError, match="reset"):
            await runner.step("<answer>up</answer>")
        await runner.close()
        assert env.closed and runner.env is None
        assert runner.counts == {"episodes": 1, "steps": 2}

    run(main())


def test_format_error_costs_the_penalty_and_does_not_step_the_env():
    async def main():
        runner = EnvRunner(Counter, action_tag="answer", format_penalty=0.25)
        await runner.reset(0)
        miss = await runner.step("up")
        assert isinstance(miss, StepResult) and miss.format_error and miss.action is None
        assert miss.reward == -0.25 and not miss.done and "<answer>" in miss.observation
        assert runner.env.value == 0 and runner.counts["format_errors"] == 1

    run(main())


def test_max_turns_truncates_and_a_terminal_step_is_not_truncated():
    async def main():
        runner = EnvRunner(lambda: Counter(target=5), action_tag=None, max_turns=2)
        await runner.reset(0)
        assert not (await runner.step("up")).done
        last = await runner.step("up")
        assert last.truncated and not last.terminated and last.done
        runner2 = EnvRunner(lambda: Counter(target=2), action_tag=None, max_turns=2)
        await runner2.reset(0)
        await runner2.step("up")
        end = await runner2.step("up")
        assert end.terminated and not end.truncated

    run(main())


@pytest.mark.parametrize(
    ("action", "kind", "words"),
    [
        ("boom", "raised", "ValueError: exploded"),
        ("hang", "timeout", "longer than 0.3 s"),
        ("die", "died", "backend process exited"),
        ("bad", "raised", "must return (observation, reward, terminated, truncated, info)"),
        ("exit", "raised", "SystemExit: 4"),
    ],
)
def test_a_failing_step_is_a_typed_failure_and_the_env_is_replaced(action, kind, words):
    async def main():
        Counter.made = 0
        runner = EnvRunner(Counter, action_tag=None, step_timeout_s=30)
        await runner.reset(0)
        runner.step_timeout_s = 0.3 if action == "hang" else 30  # a hang ends only by the limit
        broken = runner.env
        failure = await runner.step(action)
        assert isinstance(failure, EnvFailure) and failure.done
        assert (failure.kind, failure.during) == (kind, "step") and words in failure.message
        assert runner.env is None and runner.counts[f"failures/{kind}"] == 1
        await asyncio.sleep(0.05)  # the discarded env is closed in a thread of its own
        assert broken.closed
        runner.step_timeout_s = 30
        again = await runner.reset(1)  # a fresh env: the rollout goes on
        assert isinstance(again, ResetResult) and runner.env is not broken and Counter.made == 2
        assert (await runner.step("up")).done

    run(main())


def test_a_blocked_env_does_not_hold_up_other_episodes():
    async def main():
        Counter.gate.clear()
        slow = EnvRunner(Counter, action_tag=None, step_timeout_s=60)
        fast = EnvRunner(Counter, action_tag=None, step_timeout_s=60)
        await slow.reset(0)
        await fast.reset(0)
        blocked = asyncio.create_task(slow.step("wait"))
        # the fast episode finishes while the slow one is still inside its step
        assert (await fast.step("up")).observation == "at 1"
        assert (await fast.step("up")).done and not blocked.done()
        Counter.gate.set()
        assert (await blocked).observation == "at 0"

    run(main())


def test_failures_while_making_or_resetting_the_env():
    def broken_factory():
        raise OSError("no display")

    class BadReset(Counter):
        def reset(self, seed):
            return "obs without info"

    async def main():
        made = await EnvRunner(broken_factory).reset(0)
        assert (made.kind, made.during) == ("raised", "make") and "no display" in made.message
        bad = await EnvRunner(BadReset).reset(0)
        assert (bad.kind, bad.during) == ("raised", "reset") and "(observation: str, info: dict)" in bad.message

    run(main())


def test_a_constructor_past_the_timeout_fails_and_what_it_makes_late_is_closed():
    made = []
    release = threading.Event()

    class SlowToMake(Counter):
        def __init__(self) -> None:
            release.wait(10)
            super().__init__()
            made.append(self)

    async def main():
        runner = EnvRunner(SlowToMake, step_timeout_s=0.1)
        failure = await runner.reset(0)
        assert (failure.kind, failure.during) == ("timeout", "make") and runner.env is None
        release.set()
        for _ in range(200):
            if made and made[0].closed:
                break
            await asyncio.sleep(0.02)
        assert made and made[0].closed

    run(main())


def test_async_env_runs_on_the_loop_and_its_hang_is_cancelled():
    async def main():
        runner = EnvRunner(AsyncCounter, action_tag=None, step_timeout_s=30)
        assert (await runner.reset(3)).observation == "at 3"
        assert (await runner.step("go")).info == {"n": 4}
        runner.step_timeout_s = 0.2
        failure = await runner.step("hang")
        assert failure.kind == "timeout" and runner.counts["failures/timeout"] == 1
        assert (await runner.reset(0)).observation == "at 0"

    run(main())


def test_cancelling_a_step_discards_the_env():
    async def main():
        runner = EnvRunner(Counter, action_tag=None, step_timeout_s=5)
        await runner.reset(0)
        task = asyncio.create_task(runner.step("hang"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert runner.env is None  # its state is unknown: the next reset builds a new one
        assert isinstance(await runner.reset(0), ResetResult)

    run(main())


def test_a_step_cancelled_as_its_environment_answers_is_still_cancelled():
    """The environment's answer and the cancellation land in the same loop round (a worker's
    stop, a group closing): the step must end cancelled. asyncio.wait_for on Python 3.11 returned
    the answer instead, and the cancelled episode played on into its next turn."""

    async def main():
        Counter.gate.clear()
        runner = EnvRunner(Counter, action_tag=None, step_timeout_s=30)
        await runner.reset(0)
        task = asyncio.create_task(runner.step("wait"))
        while runner._in_thread is None or not runner._in_thread.running():
            await asyncio.sleep(0.01)
        answered = threading.Event()
        runner._in_thread.add_done_callback(lambda _: answered.set())  # runs after the loop was told
        Counter.gate.set()
        assert answered.wait(30)  # the answer is queued on the loop, which has not run it yet
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert runner.env is None  # discarded: its state is unknown

    try:
        run(main())
    finally:
        Counter.gate.clear()
