"""The CUDA backend's ``dc`` / ``sp`` marker helpers against ``ubep.protocol`` byte for byte, through
Triton's interpreter on the CPU (tests/cuda_markers.py): the helpers are plain ``tl`` integer code,
so no GPU is needed. Each test runs its whole matrix in one spawned process. Skipped where Triton is
not installed; kernels that poll are left to tests/test_cuda_emulated.py and tests/test_cuda.py.
"""

import pytest

from ubep.launch import run_ranks

pytest.importorskip("triton")

from tests import cuda_markers  # noqa: E402


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # inherited by the spawned process


def test_fmix32_matches_the_vectors():
    run_ranks(cuda_markers.check_fmix32, 1, timeout_s=600)


@pytest.mark.parametrize("mode", ["dc", "sp"])
def test_wire_images_and_records_match_protocol(mode):
    run_ranks(cuda_markers.check_wire_images, 1, mode, timeout_s=600)


def test_vector_rows_match_protocol():
    run_ranks(cuda_markers.check_vector_rows, 1, timeout_s=600)


def test_a_deepseek_row_matches_protocol():
    run_ranks(cuda_markers.check_deepseek_row, 1, timeout_s=600)


def test_receiver_checksum_over_held_rows():
    run_ranks(cuda_markers.check_receiver_checksum, 1, timeout_s=600)


def test_sentinel_wait_and_reset():
    run_ranks(cuda_markers.check_sentinel_wait_and_reset, 1, timeout_s=600)
