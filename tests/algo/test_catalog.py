"""The catalog of losses and estimators: what the config reads, in step with the code it names."""

from __future__ import annotations

import subprocess
import sys

from cadence.algo import advantages, catalog, losses


def test_every_catalog_entry_has_its_function_in_catalog_order():
    assert losses.names() == list(catalog.LOSSES)
    assert advantages.names() == list(catalog.ADVANTAGES)
    for name in losses.names():
        assert losses.spec(name).defaults == catalog.LOSSES[name].defaults
    assert [n for n in advantages.names() if advantages.spec(n).needs_values] == ["gae"]


def run_python(code: str) -> None:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_config_validates_without_importing_the_loss_code():
    run_python(
        "import sys\n"
        "from cadence.algo.config import AlgorithmConfig\n"
        "cfg = AlgorithmConfig(name='ppo', loss='topr', advantage='gae')\n"
        "assert cfg.aggregation == 'seq-mean-token-sum' and cfg.mismatch.mode == 'none'\n"
        "loaded = {'cadence.algo.losses', 'cadence.algo.advantages'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )


def test_a_registered_loss_of_ones_own_is_accepted_with_its_presets():
    run_python(
        "import pytest\n"
        "from cadence.algo.config import AlgorithmConfig\n"
        "from cadence.algo.losses import TokenLoss, register\n"
        "@register('mine', 'one line', defaults={'aggregation': 'seq-mean-token-mean'}, behaviour_weighted=True)\n"
        "def mine(inp, cfg):\n"
        "    return TokenLoss(-inp.advantages * inp.logprobs)\n"
        "cfg = AlgorithmConfig(loss='mine')\n"
        "assert cfg.aggregation == 'seq-mean-token-mean' and cfg.mismatch.mode == 'none'\n"
        "with pytest.raises(ValueError, match='already registered'):\n"
        "    register('ppo', 'again')\n"
    )
