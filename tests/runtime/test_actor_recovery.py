"""The critic and actor_attn actors when they die mid-run (runtime.critic_actor / credit_actor).

actor_attn holds nothing but the policy's last weights: a replacement is built in place, given
them again, and the run goes on (restarts.jsonl says so). The critics' weights and optimizer
moments change every step and lived only in the dead actor: the step fails with ActorDiedError
and the run resumes from its last checkpoint, critic state included (what the supervisor does).

The actor's process is SIGKILLed right before the trainer's n-th call to it, so the death lands
mid-run at a known point however busy the machine is."""

from __future__ import annotations

import signal
from pathlib import Path

import psutil
import pytest

from cadence.config import load_config
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train
from cadence.runtime.actors import ActorDiedError
from cadence.runtime.hosted import RemoteCredit, RemoteCritics
from tests.quick_run import QUICK_RUN

COMMON = [*QUICK_RUN, "trainer.steps=3", "runtime.kind=ray", "runtime.rollout_cpus=0.5", "runtime.threads=1",
          "logging.events=false", "runtime.placement_timeout_s=180"]


def _records(run: Path) -> list[dict]:
    return read_jsonl(run / "metrics.jsonl")


def _kill_before_call(monkeypatch, cls: type, method: str, call: int, killed: list[int]) -> None:
    """SIGKILL the actor behind `cls` (its RayActor) right before the `call`-th `method`."""
    original = getattr(cls, method)
    calls = [0]

    def kill_then_call(self, *args):
        import ray

        calls[0] += 1
        if calls[0] == call:
            pid = ray._private.state.actors(self.actor.actor._actor_id.hex())["Pid"]
            victim = psutil.Process(pid)
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=30)
            killed.append(calls[0])
        return original(self, *args)

    monkeypatch.setattr(cls, method, kill_then_call)


@pytest.fixture
def ray_shutdown():
    ray = pytest.importorskip("ray")
    yield
    ray.shutdown()


@pytest.mark.slow
def test_dead_actor_attn_is_replaced_in_place_and_the_run_goes_on(tmp_path, ray_shutdown, monkeypatch):
    run = tmp_path / "run"
    cfg = load_config(None, [*COMMON, "checkpoint.every=0", "algorithm.credit=local", "runtime.credit_actor=true",
                             "runtime.credit_cpus=0.5", f"logging.run_dir={run}"])
    killed: list[int] = []
    _kill_before_call(monkeypatch, RemoteCredit, "gammas", 2, killed)  # step 2's credit
    train(cfg)
    assert killed == [2]
    assert [r["step"] for r in _records(run)] == [1, 2, 3]  # no step lost or repeated: the run never stopped
    (entry,) = read_jsonl(run / "restarts.jsonl")
    assert entry["role"] == "actor_attn" and entry["restart"] == 1 and "gammas" in entry["cause"]
    assert all(r["rhythm/attention_seconds"] > 0 for r in _records(run))  # the replacement computed steps 2, 3


@pytest.mark.slow
def test_dead_critic_fails_the_step_and_the_run_resumes_from_its_checkpoint(tmp_path, ray_shutdown, monkeypatch):
    run = tmp_path / "run"
    cfg = load_config(None, [*COMMON, "checkpoint.every=1", "algorithm.name=ppo", "runtime.critic_actor=true",
                             "runtime.critic_cpus=0.5", f"logging.run_dir={run}"])
    killed: list[int] = []
    _kill_before_call(monkeypatch, RemoteCritics, "values", 2, killed)  # step 2's values
    with pytest.raises(ActorDiedError, match="the critic actor died"):
        train(cfg)
    assert killed == [2] and [r["step"] for r in _records(run)] == [1]
    monkeypatch.undo()
    train(cfg, resume=True)  # what the supervisor runs next: policy and critics from step 1's checkpoint
    assert [r["step"] for r in _records(run)] == [1, 2, 3]
    assert all(any(k.startswith("critic/value_loss") for k in r) for r in _records(run))
