"""Relative position buckets against tables computed by hand from the T5 definition.

Bidirectional, 32 buckets, max distance 128: 16 buckets per direction, offsets 0..7 exact,
then bucket 8 + floor(2 * log2(n / 8)) for n = |offset| (16 = 8 * 16^(8/8) reaches the cap).
Unidirectional (decoder), 32 buckets: offsets 0..15 exact, then 16 + floor(16/3 * log2(n / 16)),
whose thresholds n >= 16 * 2^(3k/16) are listed below; keys after the query share bucket 0.
"""

import numpy as np
import pytest

from t5x_like.models import layers


def _expand(first_offsets: list[int], n_max: int) -> dict[int, int]:
    """Bucket per distance n from the list of first distances of buckets start, start+1, ..."""
    table = {}
    for n in range(n_max + 1):
        table[n] = sum(1 for t in first_offsets if n >= t) - 1
    return table


# First distance of each bucket, hand-computed.
BIDIRECTIONAL_STARTS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 23, 32, 46, 64, 91]
UNIDIRECTIONAL_STARTS = list(range(16)) + [
    16,
    19,
    21,
    24,
    27,
    31,
    35,
    40,
    46,
    52,
    59,
    67,
    77,
    87,
    99,
    113,
]


def test_bidirectional_bucket_table():
    table = _expand(BIDIRECTIONAL_STARTS, 400)
    for n, bucket in table.items():
        # key before the query (relative position -n) and after it (+n, offset by 16 buckets)
        assert layers.relative_position_bucket(np.array(-n), True, 32, 128) == bucket, n
        if n > 0:
            assert layers.relative_position_bucket(np.array(n), True, 32, 128) == bucket + 16, n


def test_unidirectional_bucket_table():
    table = _expand(UNIDIRECTIONAL_STARTS, 400)
    for n, bucket in table.items():
        assert layers.relative_position_bucket(np.array(-n), False, 32, 128) == bucket, n
    # Future keys all share bucket 0 (the causal mask hides them anyway).
    assert np.all(layers.relative_position_bucket(np.arange(1, 50), False, 32, 128) == 0)


def test_spot_values():
    rel = np.array([0, -1, -7, -8, -11, -12, -16, -127, -128, -1000, 1, 8, 1000])
    np.testing.assert_array_equal(
        layers.relative_position_bucket(rel, True, 32, 128),
        [0, 1, 7, 8, 8, 9, 10, 15, 15, 15, 17, 24, 31],
    )
    np.testing.assert_array_equal(
        layers.relative_position_bucket(rel, False, 32, 128),
        [0, 1, 7, 8, 11, 12, 16, 31, 31, 31, 0, 0, 0],
    )


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (64, 256), (16, 64)])
def test_configurable_sizes_cover_all_buckets(num_buckets, max_distance):
    rel = np.arange(-4 * max_distance, 4 * max_distance + 1)
    bidi = layers.relative_position_bucket(rel, True, num_buckets, max_distance)
    uni = layers.relative_position_bucket(rel, False, num_buckets, max_distance)
    # Offset 0 counts as "before", so the first bucket of the "after" half is never used.
    assert set(bidi.tolist()) == set(range(num_buckets)) - {num_buckets // 2}
    assert set(uni.tolist()) == set(range(num_buckets))
    # Everything beyond max_distance shares the last bucket of its direction.
    assert np.all(bidi[rel <= -max_distance] == num_buckets // 2 - 1)
    assert np.all(bidi[rel >= max_distance] == num_buckets - 1)
    assert np.all(uni[rel <= -max_distance] == num_buckets - 1)
