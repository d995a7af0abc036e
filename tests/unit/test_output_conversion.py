"""The one rule for an output whose dtype differs from its declared datatype."""

from __future__ import annotations

import numpy as np
import pytest

from reposerve.instance.runner import OutputError, _conform

pytestmark = pytest.mark.unit


def test_an_empty_output_takes_the_declared_datatype_whatever_its_dtype():
    # Triton's generate test model returns np.array([]) (float64) for a BYTES output.
    assert _conform(np.array([]), "BYTES", "output 'TEXT'").dtype == object
    assert _conform(np.zeros((0, 3)), "INT8", "output 'X'").dtype == np.int8
    with pytest.raises(OutputError):  # with values, float64 still is no BYTES
        _conform(np.array([1.0]), "BYTES", "output 'TEXT'")
