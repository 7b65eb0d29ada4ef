"""hexbundle.runtime.conventions: the attention mask and the RoPE inputs the runtime feeds a graph."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hexbundle.runtime.conventions import MASK_VALUE, causal_mask, rope_inputs


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 16), st.integers(0, 32), st.data())
def test_causal_mask_lets_row_i_see_the_valid_past_and_itself(ar, past, data):
    n_past = data.draw(st.integers(0, past))
    mask = causal_mask(ar, ar + past, n_past)[0, 0]
    allowed = mask == 0
    assert set(np.unique(mask)) <= {0.0, np.float32(MASK_VALUE)}
    for i in range(ar):
        assert allowed[i].sum() == n_past + i + 1
        assert allowed[i, past - n_past:past].all() and allowed[i, past:past + i + 1].all()


def test_causal_mask_refuses_more_past_than_slots():
    with pytest.raises(ValueError):
        causal_mask(4, 8, 5)


def test_rope_inputs_shape_and_values():
    cos, sin = rope_inputs(np.array([0, 1, 5]), 16, 10000.0)
    assert cos.shape == sin.shape == (1, 1, 3, 8) and cos.dtype == np.float32
    np.testing.assert_allclose(cos[0, 0, 0], 1.0)
    np.testing.assert_allclose(sin[0, 0, 2, 0], math.sin(5.0), rtol=1e-6)
    np.testing.assert_allclose(cos[0, 0, 1, 1], math.cos(10000.0 ** (-2 / 16)), rtol=1e-6)
