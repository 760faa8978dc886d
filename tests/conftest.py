"""Shared fixtures: small HF checkpoints built from a config, one torch thread; the suite's order
and isolation for two parallel workers (pytest-xdist, the README's test command)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from tests.tiny_models import save_tiny

# Two cores: oversubscribed torch threads make small matmuls many times slower.
torch.set_num_threads(1)
# A bare ray.init() (runtime.address unset) joins the latest cluster on this machine: with two
# workers, that is the cluster another test started, and may be about to kill. Every test that does
# not name a cluster gets a fresh local one (the processes it starts inherit this).
os.environ["RAY_ADDRESS"] = "local"


@pytest.fixture(autouse=True, scope="module")
def _no_ray_left_connected():
    """A test file whose in-process train joined Ray (runtime.kind=ray) leaves it connected: a
    run never disconnects, its process ends anyway. The next file's own ray.init would fail
    ("called ray.init twice"), depending on which files a worker happened to run before it."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files that start a vLLM engine or hold end-to-end (slow) tests first, each file in its own
    order. pytest-xdist deals whole files out in this order (the README's `--dist loadfile`), so the
    long ones start early and the workers end together on short ones instead of one finishing a
    long file alone."""
    heavy = {item.path for item in items if item.get_closest_marker("slow") or item.get_closest_marker("vllm")}
    items.sort(key=lambda item: item.path not in heavy)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> str:
    """A saved Llama-architecture model and byte-level char tokenizer."""
    return save_tiny(str(tmp_path_factory.mktemp("tiny_llama")), arch="llama", hidden_size=64, layers=2)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> str:
    """A saved Qwen2-architecture model and byte-level char tokenizer."""
    return save_tiny(str(tmp_path_factory.mktemp("tiny_qwen2")), arch="qwen2", hidden_size=64, layers=2)
