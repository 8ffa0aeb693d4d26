"""The experiments' models are small: one torch thread each, as the commands run them
(``--threads`` defaults to 1); on a busy 2-core machine a second thread made them over 20x slower."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
