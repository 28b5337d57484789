"""The one validator of whole-number and positive settings. Pure."""
import numpy as np
import pytest

from lessonlib.argcheck import positive_int, positive_number


@pytest.mark.parametrize("value", [1, 7, np.int64(2)])
def test_whole_numbers_pass_as_int(value):
    assert positive_int("p", value) == int(value)
    assert type(positive_int("p", value)) is int


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "2", None, 9])
def test_other_values_get_one_line_naming_the_setting(value):
    with pytest.raises(ValueError, match=r"^p=.* must be a positive integer") as e:
        positive_int("p", value, most=8)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), 1e308 * 10, "x", True])
def test_positive_number_refuses_what_is_not_finite_and_positive(value):
    with pytest.raises(ValueError, match=r"must be a finite positive number"):
        positive_number("lr", value)
    assert positive_number("lr", 3e-4) == 3e-4
