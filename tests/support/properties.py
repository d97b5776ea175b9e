"""Property tests at two volumes: a default run sized for CI and a ``-m slow`` twin
with many more examples, from one definition.

    def _stream_equals_whole(family, data): ...

    test_stream_equals_whole = FAMILIES(property_test(_stream_equals_whole, 50))
    test_stream_equals_whole_full = FAMILIES(property_test(_stream_equals_whole, 500, slow=True))

The twins share the body, so hypothesis keeps one example database for both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def property_test(body: Callable[..., None], examples: int, *, slow: bool = False) -> Any:
    """``body(..., data)`` as a hypothesis test that draws from ``data`` (`st.data()`),
    at ``examples`` examples, without a deadline; ``slow``: marked slow."""
    test = settings(
        max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )(given(data=st.data())(body))
    return pytest.mark.slow(test) if slow else test
