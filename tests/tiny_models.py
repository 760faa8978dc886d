"""Tiny Hugging Face checkpoints on disk, for tests (no model hub here)."""

from __future__ import annotations

from cadence.models.tiny import char_tokenizer, tiny_model


def save_tiny(path: str, arch: str = "llama", seed: int = 0, **config_kwargs) -> str:
    """Write a tiny model and its tokenizer to `path` in Hugging Face format."""
    tiny_model(arch, seed, **config_kwargs).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path
