"""The engine-neutral core on a small program of its own: strict stubs, the sync-site scan,
and a site removed by recompiling its function (races computed by the recorder, with the
intact twin race-free)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest

from overlap_harness.engines.core.mutation import Coverage, remove_site
from overlap_harness.engines.core.necessity import forked_map
from overlap_harness.engines.core.sites import SiteKind, scan
from overlap_harness.engines.core.strict import StrictStub, UnplannedUseError, strict_module

PROGRAM = textwrap.dedent("""\
    import torch


    class Loop:
        def step(self, producer, consumer):
            with torch.cuda.stream(producer):
                data = torch.ones(4, device="cuda")
            consumer.wait_stream(producer)
            with torch.cuda.stream(consumer):
                total = data.sum()
            return total
    """)
WAIT_LINE = 8
READ_LINE = 10

HELPER = textwrap.dedent("""\
    import torch


    def handed_over(producer, consumer):
        with torch.cuda.stream(producer):
            data = torch.ones(4, device="cuda")
        consumer.wait_stream(producer)
        with torch.cuda.stream(consumer):
            return data.sum()
    """)
USER = "from stream_helper import handed_over\n"


def test_strict_stub_answers_planned_and_names_the_rest():
    stub = StrictStub("tree_cache", disable=True)
    assert stub.disable is True
    with pytest.raises(UnplannedUseError, match=r"^tree_cache\.evict: not planned"):
        stub.evict  # noqa: B018
    with pytest.raises(UnplannedUseError, match=r"^tree_cache\(\) called"):
        stub()
    with pytest.raises(UnplannedUseError):  # a probe would choose a branch silently
        getattr(stub, "evict", None)


def test_strict_module_names_the_missing_name():
    module = strict_module("fakevision.io", "stand-in", {"known": 1})
    assert module.known == 1
    with pytest.raises(UnplannedUseError, match=r"^fakevision\.io\.decode_jpeg: not in"):
        module.decode_jpeg  # noqa: B018


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "stream_program.py"
    path.write_text(PROGRAM)
    spec = importlib.util.spec_from_file_location("stream_program", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["stream_program"] = module
    spec.loader.exec_module(module)
    yield path
    sys.modules.pop("stream_program", None)


def test_scan_finds_the_wait_in_its_method(program):
    sites = scan(program)
    assert [(s.line, s.kind, s.function) for s in sites] == [
        (WAIT_LINE, SiteKind.WAIT_STREAM, "Loop.step")]


def _run(path_and_remove):
    """In a forked child: the program under the recorder, its wait removed or not."""
    import torch

    import overlap_harness.recorder as recorder

    path, remove = path_and_remove
    coverage = Coverage()
    if remove:
        remove_site(scan(path)[0], coverage)
    with recorder.watch(mode="cpu") as watch:
        sys.modules["stream_program"].Loop().step(torch.cuda.Stream(), torch.cuda.Stream())
        torch.cuda.synchronize()
    return ([(str(r.kind), r.first.source, r.second.source) for r in watch.races],
            coverage.reached)


def test_removed_wait_races_at_the_programs_own_lines_and_the_twin_is_clean(program):
    (mutated, reached), (intact, _) = forked_map(_run, [(str(program), True),
                                                        (str(program), False)], jobs=1)
    assert intact == []
    assert reached == {f"{program.name}:{WAIT_LINE}": 1}
    assert [(kind, second.rsplit(":", 1)[1]) for kind, _first, second in mutated] == [
        ("RAW", str(READ_LINE))]
    assert mutated[0][2].rsplit(":", 1)[0].endswith(str(program))


def _races_removed_then_restored(path):
    """In a forked child: the program's races with its wait removed, then with the removal
    undone (the GPU table's twin trials run the unmodified code in the same child)."""
    import torch

    import overlap_harness.recorder as recorder

    found = []
    undo = remove_site(scan(path)[0], Coverage())
    for _ in range(2):
        with recorder.watch(mode="cpu") as watch:
            sys.modules["stream_program"].Loop().step(torch.cuda.Stream(), torch.cuda.Stream())
            torch.cuda.synchronize()
        found.append([str(r.kind) for r in watch.races])
        undo()
    return found


def test_a_removed_method_is_put_back_by_the_undo_it_returns(program):
    [(removed, restored)] = forked_map(_races_removed_then_restored, [str(program)], jobs=1)
    assert removed == ["RAW"] and restored == []


def _helper_removed_then_restored(_):
    """In a forked child: the helper, through the module that imported it by name, with its
    wait removed and then put back."""
    import torch

    import overlap_harness.recorder as recorder

    helper = sys.modules["stream_helper"]
    found = []
    undo = remove_site(scan(helper.__file__)[0], Coverage())
    for _ in range(2):
        with recorder.watch(mode="cpu") as watch:
            sys.modules["stream_user"].handed_over(torch.cuda.Stream(), torch.cuda.Stream())
            torch.cuda.synchronize()
        found.append([str(r.kind) for r in watch.races])
        undo()
    return found, sys.modules["stream_user"].handed_over is helper.handed_over


def test_a_module_function_is_put_back_where_it_was_imported_by_name(tmp_path):
    (tmp_path / "stream_helper.py").write_text(HELPER)
    (tmp_path / "stream_user.py").write_text(USER)
    sys.path.insert(0, str(tmp_path))
    try:
        import stream_helper
        import stream_user

        original = stream_helper.handed_over
        [((removed, restored), same)] = forked_map(_helper_removed_then_restored, [None],
                                                   jobs=1)
        assert stream_user.handed_over is original  # the parent never changed
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("stream_user", None)
        sys.modules.pop("stream_helper", None)
    assert removed == ["RAW"] and restored == [] and same


def _run_helper(remove):
    """In a forked child: the helper called through a module that imported it by name."""
    import torch

    import overlap_harness.recorder as recorder

    helper = sys.modules["stream_helper"]
    coverage = Coverage()
    if remove:
        remove_site(scan(helper.__file__)[0], coverage)
    with recorder.watch(mode="cpu") as watch:
        sys.modules["stream_user"].handed_over(torch.cuda.Stream(), torch.cuda.Stream())
        torch.cuda.synchronize()
    return [str(r.kind) for r in watch.races], sum(coverage.reached.values())


def test_a_module_function_is_rebound_where_it_was_imported_by_name(tmp_path):
    (tmp_path / "stream_helper.py").write_text(HELPER)
    (tmp_path / "stream_user.py").write_text(USER)
    sys.path.insert(0, str(tmp_path))
    try:
        import stream_user  # noqa: F401  (binds handed_over by name)

        (mutated, reached), (intact, _) = forked_map(_run_helper, [True, False], jobs=1)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("stream_user", None)
        sys.modules.pop("stream_helper", None)
    assert intact == []
    assert reached == 1
    assert mutated == ["RAW"]


RING = '''
class Ring:
    def __init__(self):
        self.batch_record_buf = [None, None]

    def pin(self, slot, batch, extra):
        self.batch_record_buf[slot] = [batch]
        self.batch_record_buf[slot].extend(extra)
        return self.batch_record_buf[slot]
'''


def _pin(path_and_remove):
    """In a forked child: the ring's pin, its keep-alive write removed or not."""
    path, remove = path_and_remove
    coverage = Coverage()
    if remove:
        remove_site(scan(path)[0], coverage)
    return sys.modules["ring_program"].Ring().pin(1, "batch", ["worker_ref"]), coverage.reached


def test_a_removed_keep_alive_write_leaves_the_slot_empty_for_later_appends(tmp_path):
    path = tmp_path / "ring_program.py"
    path.write_text(RING)
    spec = importlib.util.spec_from_file_location("ring_program", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["ring_program"] = module
    spec.loader.exec_module(module)
    try:
        assert [s.kind for s in scan(path)] == [SiteKind.KEEP_ALIVE]
        (removed, reached), (intact, _) = forked_map(_pin, [(str(path), True),
                                                            (str(path), False)], jobs=1)
    finally:
        sys.modules.pop("ring_program", None)
    assert intact == ["batch", "worker_ref"]
    assert removed == ["worker_ref"]  # the batch is no longer held; the worker's ref still is
    assert reached == {"ring_program.py:7": 1}


def test_a_wrapped_crash_names_where_the_first_exception_was_raised():
    """An engine that catches a failure and raises its own message (SGLang's graph capture)
    still shows the line of the first failure; a plain crash has no such part."""
    from overlap_harness.engines.core.necessity import format_error

    def capture():
        raise RuntimeError("Cannot copy between CPU and CUDA tensors")

    def engine():
        try:
            capture()
        except RuntimeError as exc:
            raise Exception(f"Capture cuda graph failed: {exc}")  # noqa: B904

    try:
        engine()
    except Exception as exc:
        text = format_error(exc)
    first_line = capture.__code__.co_firstlineno + 1
    assert text.startswith("Exception: Capture cuda graph failed: Cannot copy")
    assert text.endswith(f"(raised while handling RuntimeError at {__file__}:{first_line} "
                         "in capture)")
    try:
        capture()
    except RuntimeError as exc:
        assert "raised while handling" not in format_error(exc)


def _mutated_with_parse_counted(path: str) -> int:
    """In a forked child: the wait removed; how many files that parsed."""
    from overlap_harness.engines.core import mutation

    before = mutation._parsed.cache_info().misses
    remove_site(scan(path)[0], Coverage())
    return mutation._parsed.cache_info().misses - before


def test_a_file_parsed_before_forking_is_not_parsed_again_and_stays_as_on_disk(program):
    import ast

    from overlap_harness.engines.core.mutation import parsed

    tree = parsed(str(program))
    unchanged = ast.dump(tree)
    assert forked_map(_mutated_with_parse_counted, [str(program)], jobs=1) == [0]
    remove_site(scan(program)[0], Coverage())  # here too: edits a copy of its function
    assert parsed(str(program)) is tree and ast.dump(tree) == unchanged
    program.write_text(PROGRAM.replace("total = data.sum()", "total = data.sum() + 1"))
    assert "+ 1" in ast.unparse(parsed(str(program)))  # changed on disk: parsed again
