"""Model tests run torch in this process with one thread.

Test machines run several suites at once on two cores; an OpenMP team of two threads then
waits for a descheduled member at every parallel region, and a step of a few thousand small
ops slowed down ~100x (a 3 s test hit the 300 s timeout). One thread is slower on an idle
machine (~1.5x) but predictable. Batch invariance does not depend on the thread count.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
