"""The engines' own output while they load (overlap_harness/engines/core/engine_output.py):
a stand-in engine that warns three ways at import (``warnings.warn``, its own logger writing
to the ``sys.stdout`` of its import, a print to stderr) is summed up in one line, shown whole
with ``--verbose``, and its logger writes to the real stdout again afterwards."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from overlap_harness.engines.core import engine_output

ENGINE = textwrap.dedent("""\
    import logging
    import sys
    import warnings

    logger = logging.getLogger("chatty_engine")
    handler = logging.StreamHandler(sys.stdout)  # bound at import, as vLLM's config does
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)

    warnings.warn("Only CUDA supports this currently.")
    logger.warning("Cannot detect CUDA architecture.")
    logger.info("Automatically detected platform cpu.")
    logger.debug("not shown: below the logger's level")
    print("Triton is installed, but has no CPU backend.", file=sys.stderr)
    """)


@pytest.fixture
def chatty_engine(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "chatty_engine.py").write_text(ENGINE)
    sys.path.insert(0, str(tmp_path))
    yield "chatty_engine"
    sys.path.remove(str(tmp_path))
    sys.modules.pop("chatty_engine", None)
    engine_output.show_engine_output(False)


def test_the_engines_warnings_are_one_line_and_its_logger_is_given_back(
        chatty_engine: str, capsys: pytest.CaptureFixture[str]) -> None:
    with engine_output.captured("chatty import") as said:
        module = importlib.import_module(chatty_engine)
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ("chatty import: 3 engine warnings and 1 engine message hidden "
                   "(--verbose shows them)\n")
    assert (said.warnings, said.messages) == (3, 1)
    module.logger.warning("said after the import")
    assert capsys.readouterr().out == "said after the import\n"


def test_verbose_shows_what_the_engine_said(chatty_engine: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    engine_output.show_engine_output(True)
    with engine_output.captured("chatty import"):
        importlib.import_module(chatty_engine)
    err = capsys.readouterr().err
    for text in ("UserWarning: Only CUDA supports this currently.",
                 "WARNING chatty_engine: Cannot detect CUDA architecture.",
                 "INFO chatty_engine: Automatically detected platform cpu.",
                 "Triton is installed, but has no CPU backend."):
        assert text in err
    assert "hidden" not in err and "below the logger's level" not in err


def test_an_engine_that_says_nothing_gets_no_line(capsys: pytest.CaptureFixture[str]) -> None:
    with engine_output.captured("quiet import"):
        pass
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("flags, shown, progress_on", [
    ([], False, True), (["-v"], True, True), (["--quiet", "--verbose"], True, False),
    (["-q"], False, False)])
def test_the_engine_commands_take_quiet_and_verbose(flags: list[str], shown: bool,
                                                    progress_on: bool) -> None:
    import argparse

    from overlap_harness.engines.core import progress
    from overlap_harness.engines.core.command import add_engine_options, apply_output_options

    parser = argparse.ArgumentParser()
    add_engine_options(parser, "sglang", "tree", "folder")
    try:
        apply_output_options(parser.parse_args(flags))
        assert (engine_output._SHOW[0], progress._SHOW[0]) == (shown, progress_on)
        assert progress.Progress("necessity").show == progress_on
    finally:
        engine_output.show_engine_output(False)
        progress.show_progress(True)


def test_runs_hold_their_output_back_for_one_line_at_the_end(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import logging
    import warnings

    registered: list[object] = []
    monkeypatch.setattr(engine_output.atexit, "register", registered.append)
    monkeypatch.setattr(engine_output, "_HELD", [])
    for run in ("first", "second"):
        with engine_output.captured(f"{run} run", summary=False):
            warnings.warn(f"{run}: Model Runner V2 requires Triton", stacklevel=1)
            logging.getLogger("chatty_runs").warning("%s: retracting", run)
    assert capsys.readouterr() == ("", "")
    assert registered == [engine_output.say_held]  # once, however many blocks
    engine_output.say_held()
    assert capsys.readouterr().err == ("engine runs: 4 engine warnings hidden "
                                       "(--verbose shows them)\n")
