"""The one validator of whole-number and positive settings, the command lines' parser, and
where a run may write. Pure."""
import numpy as np
import pytest

from lessonlib import writable
from lessonlib.argcheck import LabParser, positive_int, positive_number


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


@pytest.mark.parametrize("argv,words", [
    (["--n", "99999999999999999999"], "at most 2147483647"), (["--n", "x"], "invalid count"),
    (["--x", "1e400"], "at most 1e+12"), (["--x", "inf"], "at most 1e+12")])
def test_a_lab_parser_bounds_its_numbers_in_one_line(argv, words, capsys):
    p = LabParser(prog="lab")
    p.add_argument("--n", type=int)
    p.add_argument("--x", type=float)
    with pytest.raises(SystemExit):
        p.parse_args(argv)
    err = capsys.readouterr().err
    assert words in err and argv[0] in err and len(err.strip().splitlines()) == 1, err
    assert p.parse_args(["--n", "-2147483647", "--x", "1e12"]).n == -2147483647


def test_kernel_file_systems_are_read_from_the_mount_table(tmp_path, monkeypatch):
    assert writable.kernel_filesystem(tmp_path) is None
    table = tmp_path / "mountinfo"
    table.write_text("22 27 0:21 / /proc rw - proc proc rw\n"
                     "30 27 0:5 / /my\\040disk rw - ext4 /dev/sda1 rw\n"
                     "31 27 0:6 / /my\\040disk/sys rw - sysfs sysfs rw\n"
                     "1 0 8:1 / / rw - ext4 /dev/sda2 rw\n")
    monkeypatch.setattr(writable, "MOUNTINFO", table)
    assert writable.kernel_filesystem("/proc/x/y") == "proc"
    assert writable.kernel_filesystem("/my disk/ckpt") is None
    assert writable.kernel_filesystem("/my disk/sys/ckpt") == "sysfs"
    assert writable.kernel_filesystem("/processes") is None
    monkeypatch.setattr(writable, "MOUNTINFO", tmp_path / "none")   # no table: by path
    assert writable.kernel_filesystem("/sys/ckpt") == "sysfs"
    assert writable.kernel_filesystem("/system") is None
