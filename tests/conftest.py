"""Shared fixtures: small HF checkpoints built from a config, one torch thread."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import save_tiny

# Two cores: oversubscribed torch threads make small matmuls many times slower.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> str:
    """A saved Llama-architecture model and byte-level char tokenizer."""
    return save_tiny(str(tmp_path_factory.mktemp("tiny_llama")), arch="llama", hidden_size=64, layers=2)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> str:
    """A saved Qwen2-architecture model and byte-level char tokenizer."""
    return save_tiny(str(tmp_path_factory.mktemp("tiny_qwen2")), arch="qwen2", hidden_size=64, layers=2)
