"""The bad-input matrix's Slurm rows (tests/integration/test_bad_input_matrix.py) against the
local Slurm cluster: each refused in one line, with no job queued."""

from __future__ import annotations

import pytest

from tests.integration.test_bad_input_matrix import SLURM_ROWS, assert_refused


@pytest.mark.parametrize("row", SLURM_ROWS, ids=[row.id for row in SLURM_ROWS])
def test_bad_slurm_input_is_refused_in_one_line_and_nothing_is_queued(slurm_cluster, tmp_path,
                                                                      row):
    assert_refused(row, tmp_path)
