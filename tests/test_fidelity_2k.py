"""Fidelity of the prefill strategies on the six ~2K-token passkey prompts (words and 5-digit
numbers, seeds 1-3): see tests/fidelity.py for the prompts and what was measured."""
import os

import pytest

from fidelity import PROMPTS, misses, run_prompts, solved_by_full

# Under ASan (make test-asan) this prefill would take minutes of CI's budget for no code path the
# shorter end-to-end tests do not run sanitized: fidelity is a property of the strategies, checked
# in make test.
pytestmark = pytest.mark.skipif(os.environ.get("SIFT_ASAN") == "1",
                                reason="model fidelity, not memory safety: run in make test only")

NAMES = [n for n in PROMPTS if n.startswith("2k")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_prompts(tmp_path_factory.mktemp("fidelity_2k"), NAMES)


def test_full_solves_enough_prompts_for_the_test_to_mean_something(runs):
    assert len(solved_by_full(runs)) >= 3, solved_by_full(runs)


@pytest.mark.parametrize("strategy", ["speed", "fastkv", "specprefill"])
def test_strategy_finds_the_key_whenever_full_does(runs, strategy):
    assert not misses(runs, strategy), f"{strategy} missed keys full found: {misses(runs, strategy)}"


@pytest.mark.xfail(strict=True, reason="known (2026-11-22): at its default 2 % budget (top 21 of "
                   "2152 mid tokens per query head) topk answers 2k_w3 with ' a musical instrument' "
                   "where full says ' a harmonica'; at 5 % (top 89) it finds it, and it finds the "
                   "other keys full finds")
def test_topk_finds_the_key_whenever_full_does(runs):
    assert not misses(runs, "topk"), misses(runs, "topk")


def test_topk_first_token_is_fulls(runs):
    """topk changes only decode attention and selects exhaustively: its first generated token
    (the prompt's last token is its first query) equals full's on every prompt."""
    assert all(runs[n]["topk"]["first_token_agree"] for n in NAMES), \
        [(n, runs[n]["topk"]["text"]) for n in NAMES if not runs[n]["topk"]["first_token_agree"]]
