"""Latency wrapper, gymnasium and TextArena adapters, and the documented example environment."""

from __future__ import annotations

import asyncio
import re
import statistics
from pathlib import Path

import pytest

from cadence.envs import EnvConfig, EnvRunner
from cadence.envs.gym_adapter import GymnasiumEnv, strip_ansi
from cadence.envs.latency import AsyncLatencyEnv, LatencyEnv, with_latency
from cadence.envs.sokoban import SokobanEnv

ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------ latency


def delays(env, episode_seed: int, n: int) -> list[float | None]:
    env._start_episode(episode_seed)
    return [env.next_delay() for _ in range(n)]


def test_latency_draws_follow_the_settings_and_the_seeds():
    env = LatencyEnv(
        SokobanEnv(), mean_s=2.0, std_s=0.5, fail_slow_share=0.2, fail_slow_factor=10,
        fail_stop_share=0.1, seed=1,
    )  # fmt: skip
    draws = delays(env, 0, 4000)
    stops = [d for d in draws if d is None]
    slow = [d for d in draws if d is not None and d > 6.0]  # 10x of >= 0.6 s: never a normal draw
    normal = [d for d in draws if d is not None and d <= 6.0]
    assert abs(len(stops) / 4000 - 0.1) < 0.02 and abs(len(slow) / 4000 - 0.2) < 0.03
    assert abs(statistics.mean(normal) - 2.0) < 0.05 and abs(statistics.stdev(normal) - 0.5) < 0.05
    assert abs(statistics.mean(slow) - 20.0) < 0.5
    assert delays(env, 5, 50) == delays(env, 5, 50) != delays(env, 6, 50)
    assert min(delays(LatencyEnv(SokobanEnv(), mean_s=0.0, std_s=1.0), 0, 200)) == 0.0  # clipped


def test_episodes_on_one_seed_draw_their_own_delays():
    """A group's episodes share a seed but not their environments' latency: one fail-slow
    server does not make the whole group slow (redundancy relies on that)."""
    make = lambda: LatencyEnv(SokobanEnv(), mean_s=1.0, std_s=1.0, seed=3)  # noqa: E731
    assert delays(make(), 5, 20) != delays(make(), 5, 20)


def test_latency_wrapper_keeps_the_inner_envs_behaviour_and_kind():
    inner = SokobanEnv()
    env = with_latency(inner, mean_s=0.001)
    assert isinstance(env, LatencyEnv) and env.action_tag == "answer"
    assert env.reset(4) == inner.reset(4)
    twin = SokobanEnv()
    twin.reset(4)
    move = env.expert_action()  # reaches the inner env
    assert move == twin.expert_action() and env.step(move) == twin.step(move)

    class AsyncEnv:
        async def reset(self, seed):
            return "a", {}

        async def step(self, action):
            return action, 0.0, False, False, {}

    assert isinstance(with_latency(AsyncEnv()), AsyncLatencyEnv)


@pytest.mark.parametrize("inner_kind", ["sync", "async"])
def test_fail_stop_steps_time_out_in_the_runner_and_the_next_episode_runs(inner_kind):
    class AsyncSokoban(SokobanEnv):
        async def reset(self, seed):
            return SokobanEnv.reset(self, seed)

        async def step(self, action):
            return SokobanEnv.step(self, action)

    inner = SokobanEnv if inner_kind == "sync" else AsyncSokoban
    stop = {"fail_stop_share": 1.0}

    async def main():
        runner = EnvRunner(lambda: with_latency(inner(), **stop), step_timeout_s=30)
        await runner.reset(0)
        wrapped = runner.env
        runner.step_timeout_s = 0.3  # the fail-stop step never answers: any limit ends it
        failure = await runner.step("<answer>Up</answer>")
        assert failure.kind == "timeout" and runner.counts["failures/timeout"] == 1
        if inner_kind == "sync":
            await asyncio.sleep(0.05)
            assert wrapped._closed.is_set()  # close() released the thread stuck in the step
        stop["fail_stop_share"] = 0.0  # the replacement answers
        runner.step_timeout_s = 30
        await runner.reset(0)
        assert (await runner.step("<answer>Up</answer>")).observation.startswith("#")

    asyncio.run(main())


# ------------------------------------------------------------------ gymnasium


def test_gymnasium_env_with_ansi_rendering_and_named_actions():
    env = GymnasiumEnv("FrozenLake-v1", actions=["Left", "Down", "Right", "Up"],
                       make_kwargs={"is_slippery": False})  # fmt: skip
    obs, _ = env.reset(0)
    assert obs.splitlines()[0] == "[S]FFF" and "\x1b" not in obs and "Left, Down" in obs
    obs, reward, terminated, _, _ = env.step("down")
    assert "[F]HFH" in obs and (reward, terminated) == (0.0, False)
    assert env.step("fly")[4] == {"invalid_action": True}


def test_gymnasium_env_without_text_rendering_shows_the_observation():
    env = GymnasiumEnv("CartPole-v1", actions=["push left", "push right"])
    obs, _ = env.reset(1)
    assert env.render_mode is None and obs.startswith("[") and "push left" in obs
    obs, reward, terminated, truncated, _ = env.step("push right")
    assert reward == 1.0 and obs.startswith("[")
    with pytest.raises(ValueError, match="no environment 'NoSuchEnv-v0'"):
        GymnasiumEnv("NoSuchEnv-v0")
    with pytest.raises(ValueError, match="neither Discrete nor Text"):
        GymnasiumEnv("Pendulum-v1")


def test_strip_ansi():
    assert strip_ansi("\x1b[41mS\x1b[0mFF\x1b[1;32m!\x1b[0m") == "SFF!"
    assert strip_ansi("\x1b[41mS\x1b[0mFF", mark_highlight=True) == "[S]FF"


def test_gymnasium_by_config():
    cfg = EnvConfig(name="gymnasium", kwargs={"id": "FrozenLake-v1", "actions": ["L", "D", "R", "U"]})

    async def main():
        runner = EnvRunner.from_config(cfg)
        assert "[S]" in (await runner.reset(0)).observation
        assert (await runner.step("<answer>D</answer>")).action == "D"

    asyncio.run(main())


# ------------------------------------------------------------------ textarena


def test_textarena_guess_the_number_by_bisection():
    pytest.importorskip("textarena", reason="optional extra: pip install 'cadence[envs-textarena]'")
    from cadence.envs.textarena_adapter import TextArenaEnv

    env = TextArenaEnv("GuessTheNumber-v0")
    obs, _ = env.reset(3)
    low, high = map(int, re.search(r"between (\d+) and (\d+)", obs).groups())
    for _ in range(10):
        guess = (low + high) // 2
        obs, reward, terminated, truncated, info = env.step(f"I will try [{guess}]")
        assert f"[{guess}]" not in obs  # its own move is not echoed back
        if terminated:
            break
        low, high = (low, guess - 1) if "lower" in obs else (guess + 1, high)
    assert terminated and reward == 1.0 and "correct number" in obs and not info["invalid_move"]
    second, _ = env.reset(4)  # a finished game resets for the next episode
    assert "Guess The Number" in second
    with pytest.raises(ValueError, match="no game 'NoSuchGame-v0'"):
        TextArenaEnv("NoSuchGame-v0")
    with pytest.raises(ValueError, match="did you mean 'GuessTheNumber-v0'"):
        EnvConfig(name="textarena", kwargs={"id": "GuessTheNumbr-v0"})


# ------------------------------------------------------------------ the documented example


def test_the_docs_example_is_the_tested_file():
    doc = (ROOT / "docs/agentic.md").read_text()
    block = re.search(
        r"<!-- include: examples/envs/guess_number.py -->\n```python\n(.*?)```", doc, re.DOTALL
    )
    assert block is not None, "docs/agentic.md lost its example"
    assert block.group(1) == (ROOT / "examples/envs/guess_number.py").read_text()


def test_the_docs_example_plays_through_the_runner():
    spec = f"python:{ROOT / 'examples/envs/guess_number.py'}:GuessNumber"
    cfg = EnvConfig(name=spec, kwargs={"high": 50}, max_turns=10)

    async def main():
        runner = EnvRunner.from_config(cfg)
        first = await runner.reset(9)
        low, high, secret = 1, 50, first.info["secret"]
        assert "1 to 50" in first.observation
        for _ in range(10):
            guess = (low + high) // 2
            step = await runner.step(f"Maybe <answer>{guess}</answer>")
            if step.done:
                break
            low, high = (guess + 1, high) if step.observation == "higher" else (low, guess - 1)
        assert step.terminated and step.reward == 1.0 and guess == secret
        await runner.close()

    asyncio.run(main())
