"""The ``stream_races`` marker and fixture (overlap_harness/pytest_races.py), on a user's test
file run by its own pytest: GPU mode without a GPU skips; marker and fixture share one watch;
a test failing on its own still reports its races; ``expect`` declares the races a test is
meant to have. Every verdict is the recorder's (CPU mode), every racy test has a fixed twin."""

from __future__ import annotations

import textwrap
import xml.etree.ElementTree as ET

import pytest
import torch

from overlap_harness.pytest_races import MarkerError, marker_settings
from tests.plugin.conftest import run_pytest_in

USER_TESTS = textwrap.dedent("""\
    import pytest
    import torch

    def program(fixed, second_race=False):
        side = torch.cuda.Stream()
        data = torch.zeros(4, device="cuda")
        flags = torch.zeros(2, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            data.fill_(1)
            flags.fill_(1)
        if fixed:
            torch.cuda.current_stream().wait_stream(side)
        data.sum()
        if second_race:
            flags.sum()

    @pytest.mark.stream_races(mode="gpu")
    def test_gpu_racy():
        program(False)

    @pytest.mark.stream_races(mode="gpu")
    def test_gpu_fixed():
        program(True)

    @pytest.mark.stream_races(mode="cpu")
    def test_shared_racy(stream_races):
        program(False)
        assert [r.kind for r in stream_races.races] == ["RAW"]  # the marker's own watch

    @pytest.mark.stream_races(mode="cpu")
    def test_shared_fixed(stream_races):
        program(True)
        assert stream_races.races == []

    @pytest.mark.stream_races
    def test_own_assert_racy():
        program(False)
        assert 1 == 2, "the test's own failure"

    @pytest.mark.stream_races
    def test_own_assert_fixed():
        program(True)
        assert 1 == 2, "the test's own failure"

    @pytest.mark.stream_races(expect=["RAW data"])
    def test_expected_racy():
        program(False)

    @pytest.mark.stream_races(expect=["RAW data"])
    def test_expected_fixed():
        program(True)

    @pytest.mark.stream_races(expect=["RAW data@test_user.py:6"])
    def test_expected_at_its_allocation_racy():
        program(False)

    @pytest.mark.stream_races(expect=["RAW data"])
    def test_unexpected_racy():
        program(False, second_race=True)

    @pytest.mark.stream_races(expect=["RAW data", "RAW flags"])
    def test_unexpected_fixed():
        program(False, second_race=True)

    @pytest.mark.stream_races(expect=["WAR data"])
    def test_wrong_kind_racy():
        program(False)

    @pytest.mark.stream_races(expect="RAW data")
    def test_expect_not_a_list():
        program(True)

    @pytest.mark.stream_races(mode="tpu")
    def test_unknown_mode():
        program(True)
    """)


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, tuple[str, str]], str]:
    """Each user test's outcome (passed, failed, error, skipped) and text, from one run of
    the user's pytest; and its terminal output."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "test_user.py").write_text(USER_TESTS)
    got = run_pytest_in(folder, "-q", "--junitxml=junit.xml", "test_user.py")
    assert got.returncode == 1, got.stdout + got.stderr
    cases = {}
    for case in ET.parse(folder / "junit.xml").getroot().iter("testcase"):
        kind, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                kind = "failed" if child.tag == "failure" else child.tag
                text = child.get("message", "") if kind == "skipped" else child.text or ""
        cases[case.get("name")] = (kind, text)
    return cases, got.stdout + got.stderr


def test_gpu_mode_without_a_gpu_skips_with_the_reason(outcome) -> None:
    cases, output = outcome
    if torch.cuda.is_available():  # a GPU machine runs them: the recorder's verdicts
        assert cases["test_gpu_racy"][0] == "failed" and cases["test_gpu_fixed"][0] == "passed"
        return
    for name in ("test_gpu_racy", "test_gpu_fixed"):
        kind, text = cases[name]
        assert kind == "skipped"
        assert "stream_races: mode 'gpu' needs a CUDA device" in text
    assert "Traceback" not in output and "RecorderError" not in output


def test_marker_and_fixture_share_one_watch(outcome) -> None:
    cases, output = outcome
    kind, text = cases["test_shared_racy"]
    assert kind == "failed"  # by the marker: the in-test assert on the fixture's races held
    assert text.startswith("1 stream race in test_user.py::test_shared_racy")
    assert "RAW race on data@test_user.py:6" in text
    assert cases["test_shared_fixed"] == ("passed", "")
    assert "do not nest" not in output


def test_a_test_failing_on_its_own_still_reports_its_races(outcome) -> None:
    cases, output = outcome
    kind, text = cases["test_own_assert_racy"]
    assert kind == "failed" and "the test's own failure" in text
    races = text.split("stream races")[1]
    assert "1 stream race in test_user.py::test_own_assert_racy" in races
    assert "first:  fill_ on side writing data@test_user.py:6" in races
    kind, text = cases["test_own_assert_fixed"]
    assert kind == "failed" and "the test's own failure" in text
    assert "stream race" not in text
    assert "test_own_assert_racy\nRAW race on data" in output  # the terminal shows it too


def test_expected_races_pass_and_an_expected_race_that_did_not_occur_fails(outcome) -> None:
    cases, _ = outcome
    assert cases["test_expected_racy"] == ("passed", "")
    assert cases["test_expected_at_its_allocation_racy"] == ("passed", "")
    kind, text = cases["test_expected_fixed"]
    assert kind == "failed"
    assert text.startswith("expected stream race not found in "
                           "test_user.py::test_expected_fixed: RAW data")


def test_a_race_not_expected_fails(outcome) -> None:
    cases, _ = outcome
    kind, text = cases["test_unexpected_racy"]
    assert kind == "failed"
    assert text.startswith("1 stream race in test_user.py::test_unexpected_racy")
    assert "RAW race on flags@test_user.py:7" in text and "race on data" not in text
    assert cases["test_unexpected_fixed"] == ("passed", "")
    kind, text = cases["test_wrong_kind_racy"]
    assert kind == "failed"
    assert "RAW race on data@test_user.py:6" in text
    assert "expected stream race not found in test_user.py::test_wrong_kind_racy: WAR data" \
        in text


def test_bad_marker_arguments_are_one_line(outcome) -> None:
    cases, output = outcome
    kind, text = cases["test_expect_not_a_list"]
    assert kind == "error"
    assert text.startswith('stream_races: expect: a list of "KIND tensor" strings, e.g. '
                           "expect=[\"RAW buf\"], got 'RAW data'")
    kind, text = cases["test_unknown_mode"]
    assert kind == "error"
    assert text.startswith("stream_races: mode: expected one of auto|cpu|gpu, got 'tpu'")
    assert "Traceback" not in output and "During handling" not in output


@pytest.mark.parametrize(("args", "kwargs", "line"), [
    ((), {"expect": ["RAWdata"]}, "stream_races: expect: 'RAWdata' is not \"KIND tensor\" "
                                  "with KIND one of RAW|WAR|WAW|host-D2H|reuse, e.g. \"RAW buf\""),
    ((), {"expect": [3]}, "stream_races: expect: 3 is not \"KIND tensor\""),
    ((), {"expct": []}, "stream_races: unknown argument 'expct'; expected mode or expect"),
    (("cpu",), {}, "stream_races: takes keyword arguments only (mode=..., expect=[...]), "
                   "got 'cpu'"),
])
def test_marker_arguments_are_checked(args, kwargs, line) -> None:
    with pytest.raises(MarkerError) as caught:
        marker_settings(args, kwargs)
    assert str(caught.value).startswith(line)


def test_expect_entries_are_normalised() -> None:
    got = marker_settings((), {"mode": "cpu", "expect": [" host-D2H   pinned "]})
    assert (got.mode, got.expect) == ("cpu", ("host-D2H pinned",))
