"""Row splits over processes: whole blocks, contiguous, in order, covering every row once."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sarjax.runtime.distributed import allgather_rows, initialize, process_blocks, process_rows


@given(n=st.integers(0, 60), block=st.integers(1, 9), count=st.integers(1, 6))
def test_process_blocks_partition_into_whole_blocks(n, block, count):
    parts = [process_blocks(n, block, i, count) for i in range(count)]
    np.testing.assert_array_equal(np.concatenate(parts), np.arange(n))  # every row once, in process order
    batches_one = [list(range(s, min(n, s + block))) for s in range(0, n, block)]
    batches_split = [list(p[s : s + block]) for p in parts for s in range(0, len(p), block)]
    assert batches_split == batches_one  # each process runs exactly the one-process batches
    sizes = [-(-len(p) // block) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_process_blocks_examples_and_errors():
    assert [process_blocks(10, 4, i, 2).tolist() for i in range(2)] == [list(range(8)), [8, 9]]
    assert [process_blocks(3, 4, i, 2).tolist() for i in range(2)] == [[0, 1, 2], []]
    with pytest.raises(ValueError, match="block must be an int >= 1"):
        process_blocks(4, 0, 0, 1)
    with pytest.raises(ValueError, match="n must be >= 0"):
        process_blocks(-1, 2, 0, 1)


def test_one_process_helpers():
    a = {"x": np.arange(6).reshape(3, 2), "y": np.zeros((3,), bool)}
    got = allgather_rows(a)
    assert sorted(got) == ["x", "y"] and all(np.array_equal(got[k], a[k]) for k in a)
    np.testing.assert_array_equal(process_rows(5), np.arange(5))
    with pytest.raises(ValueError, match="go together"):
        initialize("localhost:1234", None, None)
    with pytest.raises(ValueError, match="HOST:PORT"):
        initialize("localhost", 2, 0)
    with pytest.raises(ValueError, match=r"process_id must be in \[0, 2\)"):
        initialize("localhost:1234", 2, 2)
