"""The index-mixture probe's distributions (scripts/bench/index_mix_oracle.py): proper, and the ones they claim to be."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "bench"))
import index_mix_oracle as oracle  # noqa: E402

V = 10


def _every_target(fn, *rows):
    """fn's probability of every token 0..V-1 for one position whose lookup rows are `rows` (each (1, ...))."""
    return np.array([fn(*rows, np.array([y]))[0] for y in range(V)])


def test_top_k_is_the_smoothed_count_distribution():
    nxt, cnt = np.array([[3, 7, -1, -1]]), np.array([[6, 2, 0, 0]])
    p = _every_target(lambda n, c, y: oracle.p_top(c, n, y, 4, V), nxt, cnt)
    assert abs(p.sum() - 1) < 1e-9
    assert p[3] == (6 + oracle.DELTA) / (8 + oracle.DELTA * V) and p[0] == oracle.DELTA / (8 + oracle.DELTA * V)
    assert _every_target(lambda n, c, y: oracle.p_top(c, n, y, 1, V), nxt, cnt)[7] < 1e-5  # k = 1 drops token 7


def test_backoff_is_witten_bell_over_longer_and_longer_contexts():
    short = (np.array([2]), np.array([[1, 4, 5]]), np.array([[5, 3, 2]]))  # 2 tokens matched: 10 seen, 3 kinds
    long = (np.array([6]), np.array([[4, -1, -1]]), np.array([[2, 0, 0]]))  # 6 matched: 2 seen, 1 kind
    p_short = _every_target(lambda y: oracle.p_backoff([short], y, V))
    np.testing.assert_allclose(p_short[[1, 4, 5, 0]], [(5 + 3 / V) / 13, (3 + 3 / V) / 13, (2 + 3 / V) / 13, 3 / V / 13])
    p = _every_target(lambda y: oracle.p_backoff([long, short], y, V))  # longest cap first, as the probe passes them
    np.testing.assert_allclose(p, (2 * (np.arange(V) == 4) + 1 * p_short) / 3)
    assert abs(p.sum() - 1) < 1e-9
    same = (np.array([2]), short[1], short[2])  # a cap that gave the same context again changes nothing
    np.testing.assert_allclose(_every_target(lambda y: oracle.p_backoff([same, short], y, V)), p_short)
