"""Fidelity of the prefill strategies on the ~6K-token passkey prompt (a word key, seed 4): see
tests/fidelity.py for the prompt and what was measured."""
import os

import pytest

from fidelity import misses, run_prompts, solved_by_full

# As in test_fidelity_2k.py: fidelity, not memory safety, so not under ASan.
pytestmark = pytest.mark.skipif(os.environ.get("SIFT_ASAN") == "1",
                                reason="model fidelity, not memory safety: run in make test only")

NAMES = ["6k_w4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_prompts(tmp_path_factory.mktemp("fidelity_6k"), NAMES)


def test_full_finds_the_key_so_the_test_means_something(runs):
    assert solved_by_full(runs) == NAMES, runs["6k_w4"]["full"]["text"]


@pytest.mark.parametrize("strategy", ["speed", "fastkv", "topk"])
def test_strategy_finds_the_key_whenever_full_does(runs, strategy):
    assert not misses(runs, strategy), f"{strategy} missed keys full found: {misses(runs, strategy)}"


@pytest.mark.xfail(strict=True, reason="known (2026-11-22): with a self-draft of the 135M model "
                   "(15 of 30 layers) and keep 0.3, specprefill drops the needle chunk of the 6K "
                   "prompt that full solves; it finds all 4 of full's 2K keys")
def test_specprefill_finds_the_key_whenever_full_does(runs):
    assert not misses(runs, "specprefill"), misses(runs, "specprefill")


def test_topk_first_token_is_fulls(runs):
    """topk changes only decode attention and selects exhaustively: its first generated token
    equals full's."""
    assert runs["6k_w4"]["topk"]["first_token_agree"], runs["6k_w4"]["topk"]["text"]
