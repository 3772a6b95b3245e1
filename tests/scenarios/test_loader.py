"""The scenario layer: loading, every kind of bad input (exact lines), expansion, key reference."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import textwrap
from pathlib import Path

import pytest

from overlap_harness.model.config import Expect, Mode, Scenario, WarBarrier
from overlap_harness.model.errors import HarnessError, ScenarioError
from overlap_harness.scenarios.buffers import PROTOCOL_BUFFERS, is_protocol_buffer
from overlap_harness.scenarios.expand import expand, scenario_to_dict
from overlap_harness.scenarios.keyref import render
from overlap_harness.scenarios.loader import _keys, load_paths, load_scenario
from overlap_harness.scenarios.rules import Problems
from overlap_harness.scenarios.schema import SYNC_LABELS, all_fields, element_type, is_table


@dataclasses.dataclass(frozen=True, slots=True)
class FutureTable:
    """A table model/config.py might grow: the loader must check it with no change."""

    depth: int = dataclasses.field(default=1, metadata={"help": "d", "range": (1, 3)})
    mode: Mode = dataclasses.field(default=Mode.SPEC_V2, metadata={"help": "m"})
    labels: tuple[str, ...] = dataclasses.field(default=(), metadata={"help": "l"})


DATA = Path(__file__).resolve().parent.parent / "data" / "scenarios"
REPO = Path(__file__).resolve().parent.parent.parent
WAR_CHOICES = "none|loop_top|read_done|after_launch|after_replay_prepare|after_launch_read_done"


def problems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> list[str]:
    """Write ``text`` to x.toml, load it by its relative path, return the problem lines."""
    monkeypatch.chdir(tmp_path)
    Path("x.toml").write_text(textwrap.dedent(text))
    with pytest.raises(ScenarioError) as info:
        load_scenario("x.toml")
    return without_lines(info.value.problems)


def without_lines(problems: list[str]) -> list[str]:
    """The problem lines less their ``line N:`` part: these golden lines are about the key
    and the reason; the line a key is found on is tested on its own (test_locate.py, and
    :func:`test_every_problem_in_one_file_is_reported`)."""
    return [re.sub(r"^([^:]+): line \d+: (?=[^:]+: )", r"\1: ", p) for p in problems]


# --- good input ------------------------------------------------------------------------------

def test_good_file_loads_with_values_from_the_file() -> None:
    path = str(DATA / "good.toml")
    s = load_scenario(path)
    assert s.name == "spec_v2_decode_publish_ready"
    assert s.path == path
    assert s.protocol.mode is Mode.SPEC_V2
    assert s.protocol.war_barrier is WarBarrier.LOOP_TOP
    assert s.protocol.gather.value == "triton"
    assert s.protocol.debug_poison is True
    assert [(r.id, r.arrive, r.prompt_len, r.max_new) for r in s.workload.requests] == [
        ("A", 0, 12, 10), ("B", 2, 5, 3)]
    assert [(e.at, e.kind.value, e.id) for e in s.workload.events] == [
        (4, "retract", "A"), (5, "idle", "")]
    assert s.timing.forward == 2000.0 and isinstance(s.timing.forward, float)
    assert s.timing.process_results == 50.0  # not in the file: the default
    assert s.mutation[0].remove == ("publish_ready.schedule_wait",)
    assert s.mutation[1].set == {"war_barrier": WarBarrier.NONE}
    assert s.mutation[1].races == ("RAW new_seq_lens_buf",)


def test_missing_name_defaults_to_file_stem(tmp_path: Path) -> None:
    (tmp_path / "decode_only.toml").write_text("[workload]\niterations = 3\n")
    s = load_scenario(tmp_path / "decode_only.toml")
    assert (s.name, s.workload.iterations) == ("decode_only", 3)


def test_non_spec_mode_ignores_spec_only_shape(tmp_path: Path) -> None:
    (tmp_path / "n.toml").write_text(
        '[protocol]\nmode = "non_spec"\ntopk = 1\nnum_steps = 3\nnum_draft_tokens = 9\n')
    assert load_scenario(tmp_path / "n.toml").protocol.num_draft_tokens == 9


def test_folder_is_searched_recursively_and_sorted() -> None:
    folder = DATA / "suite"
    loaded = load_paths([folder])
    assert [s.name for s in loaded] == ["suite_two", "suite_one"]  # nested/ sorts before one
    assert loaded[0].path == str(folder / "nested" / "two.toml")


def test_same_file_twice_is_loaded_once() -> None:
    loaded = load_paths([DATA / "suite", DATA / "suite" / "one.toml"])
    assert sorted(s.name for s in loaded) == ["suite_one", "suite_two"]


# --- one kind of bad input per test, exact lines ---------------------------------------------

def test_enum_choice(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, '[protocol]\nwar_barrier = "loop-top"\n')
    assert lines == [
        f'x.toml: protocol.war_barrier: expected one of {WAR_CHOICES}, got "loop-top"']


def test_unknown_keys_and_tables(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, """\
        nmae = "x"
        [protocl]
        [timing]
        zzz = 1
        """)
    assert lines == [
        "x.toml: nmae: unknown key; did you mean name?",
        "x.toml: protocl: unknown table; did you mean protocol?",
        "x.toml: timing.zzz: unknown key; valid keys: host_launch, schedule_prep, "
        "process_results, schedule_kernel, forward, verify_share, d2h, jitter",
    ]


def test_loader_owned_field_is_not_a_file_key(tmp_path, monkeypatch) -> None:
    assert problems(tmp_path, monkeypatch, 'path = "elsewhere.toml"\n') == [
        "x.toml: path: is set by the loader, not by the file; remove it"]


def test_wrong_types(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, """\
        name = 3
        [protocol]
        topk = "2"
        num_steps = true
        pool_size = 16.0
        hidden_states = "false"
        [timing]
        forward = 1500
        d2h = "fast"
        """)
    assert lines == [
        "x.toml: name: expected a string, got 3",
        'x.toml: protocol.topk: expected an integer, got "2"; write 2 without quotes',
        "x.toml: protocol.num_steps: expected an integer, got true",
        "x.toml: protocol.pool_size: expected an integer, got 16.0; write 16",
        'x.toml: protocol.hidden_states: expected true or false, got "false"; '
        "write false without quotes",
        'x.toml: timing.d2h: expected a number, got "fast"',
    ]


def test_int_is_accepted_for_float(tmp_path: Path) -> None:
    (tmp_path / "t.toml").write_text("[timing]\nforward = 1500\n")
    forward = load_scenario(tmp_path / "t.toml").timing.forward
    assert (forward, type(forward)) == (1500.0, float)


def test_ranges(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, """\
        [protocol]
        topk = 9
        [timing]
        verify_share = 1.5
        [workload]
        requests = [{ id = "A", max_new = 0 }]
        """)
    assert lines == [
        "x.toml: protocol.topk: expected 1..8, got 9",
        "x.toml: timing.verify_share: expected 0.0..1.0, got 1.5",
        "x.toml: workload.requests[0].max_new: expected 1..1048576, got 0",
    ]


def test_arrays_of_tables(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, """\
        [workload]
        requests = [{ id = "A" }, { id = "B", max_new = "3" }, 7]
        events = { at = 1 }
        [mutation]
        remove = ["war_barrier"]
        """)
    assert lines == [
        'x.toml: workload.requests[1].max_new: expected an integer, got "3"; '
        "write 3 without quotes",
        "x.toml: workload.requests[2]: expected a table, got 7",
        "x.toml: workload.events: expected an array of tables, got a table; "
        "write [[workload.events]] for each entry",
        "x.toml: mutation: expected an array of tables, got a table; "
        "write [[mutation]] for each entry",
    ]


def test_toml_syntax_error_names_line_and_column() -> None:
    path = str(DATA / "bad_syntax.toml")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert info.value.problems == [f"{path}: line 4, column 8: TOML syntax error: Invalid value"]


def test_topk1_fast_path_shape(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, "[protocol]\ntopk = 1\nnum_steps = 3\n"
                                            "num_draft_tokens = 6\n")
    assert lines == ["x.toml: protocol.num_draft_tokens: topk = 1 needs num_draft_tokens = "
                     "num_steps + 1 = 4, got 6; set num_draft_tokens = 4"]


def test_topk_tree_size_limit(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, "[protocol]\ntopk = 2\nnum_steps = 2\n"
                                            "num_draft_tokens = 8\n")
    assert lines == ["x.toml: protocol.num_draft_tokens: topk = 2 and num_steps = 2 draft at "
                     "most 1 + topk + (num_steps - 1)*topk^2 = 7 tokens, got 8"]


def test_protocol_combinations(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, """\
        [protocol]
        platform = "hip"
        delayed_sampling = true
        [[mutation]]
        set = { delayed_sampling = false, delayed_stash_after_gather = true }
        """)
    assert lines == [
        'x.toml: protocol.seq_lens_d2h: platform = "hip" has no D2H stream (it is CUDA only); '
        'use "schedule_stream" or "none"',
        'x.toml: protocol.delayed_sampling: delayed sampling is the non-spec grammar path; '
        'set mode = "non_spec"',
        "x.toml: mutation[0].set.delayed_stash_after_gather: with this override, moves the "
        "delayed-sampling stash, so it needs delayed_sampling = true",
    ]


def test_a_bad_key_does_not_cascade_into_rules(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, 'num_steps = 1\n[protocol]\nnum_steps = "5"\n')
    assert lines == [
        "x.toml: num_steps: unknown key; did you mean protocol.num_steps?",
        'x.toml: protocol.num_steps: expected an integer, got "5"; write 5 without quotes',
    ]  # no topk=1 line built from the default num_steps


def test_mutation_labels_overrides_and_names(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, """\
        [[mutation]]
        remove = ["war_barrier", "forward_entry", "war_barrier"]
        [[mutation]]
        remove = ["publish_ready.schedule_wiat"]
        [[mutation]]
        set = { war_barier = "none", gather = "cuda", num_steps = 2 }
        [[mutation]]
        remove = ["batch_pin_ring"]
        [[mutation]]
        name = "batch_pin_ring"
        remove = ["stash.fifo"]
        [[mutation]]
        expect = "race"
        [[mutation]]
        name = "base"
        remove = ["stash.fifo"]
        """)
    labels = "|".join(SYNC_LABELS)
    assert lines == [
        "x.toml: mutation[2].set.war_barier: unknown key; did you mean war_barrier?",
        'x.toml: mutation[2].set.gather: expected one of unfused|fused|triton, got "cuda"',
        'x.toml: mutation[0].remove[2]: "war_barrier" is listed twice',
        'x.toml: mutation[1].remove[0]: unknown sync label "publish_ready.schedule_wiat"; '
        f"did you mean publish_ready.schedule_wait? valid labels: {labels}",
        "x.toml: mutation[2].set.num_steps: with this override, topk = 1 needs "
        "num_draft_tokens = num_steps + 1 = 3, got 4; set num_draft_tokens = 3",
        "x.toml: mutation[5]: removes no sync and sets no key, so it repeats the base run; "
        "add remove = [...] or set = {...}",
        'x.toml: mutation[4].name: "batch_pin_ring" is already the name of '
        "mutation[3]; mutation names must be unique, set name = ...",
        'x.toml: mutation[6].name: "base" is reserved for the run without mutation; '
        "choose another name",
    ]


def test_races_format_and_contradiction(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, """\
        [check]
        races = ["RAW new_seq_lens_buf", "raw new_seq_lens_buf", "WAR"]
        [[mutation]]
        remove = ["war_barrier"]
        expect = "race_free"
        races = ["WAR req_to_token"]
        """)
    kinds = "RAW|WAR|WAW|host-D2H|reuse"
    assert lines == [
        f'x.toml: check.races[1]: expected "KIND buffer" with KIND one of {kinds}, '
        'got "raw new_seq_lens_buf"; did you mean RAW?',
        f'x.toml: check.races[2]: expected "KIND buffer" with KIND one of {kinds}, got "WAR"',
        'x.toml: check.races: expect = "race_free" contradicts 3 expected race(s); '
        'set expect = "race" or races = []',
        'x.toml: mutation[0].races: expect = "race_free" contradicts 1 expected race(s); '
        'set expect = "race" or races = []',
    ]


def test_a_race_on_a_buffer_the_protocol_lacks_names_the_buffers(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("x.toml").write_text(textwrap.dedent("""\
        [check]
        expect = "race"
        races = ["RAW new_seq_lens_bf", "WAR conf_ring_2"]
        [[mutation]]
        remove = ["war_barrier"]
        expect = "race"
        races = ["WAR req_to_token", "reuse nothing_like_it"]
        """))
    with pytest.raises(ScenarioError) as info:
        load_scenario("x.toml")
    known = "|".join(PROTOCOL_BUFFERS) + "|conf_ring_<N>"
    assert info.value.problems == [
        'x.toml: line 3: check.races[0]: unknown buffer "new_seq_lens_bf"; did you mean '
        f"new_seq_lens_buf? the protocol's buffers are {known}",
        'x.toml: line 7: mutation[0].races[1]: unknown buffer "nothing_like_it"; the '
        f"protocol's buffers are {known}",
    ]
    Path("x.toml").write_text(Path("x.toml").read_text().replace("_bf", "_buf")
                              .replace("nothing_like_it", "new_seq_lens_buf"))
    assert load_scenario("x.toml").check.races[0] == "RAW new_seq_lens_buf"  # the fixed twin


def test_the_buffer_list_is_what_the_protocol_allocates() -> None:
    """Every buffer a bundled run allocates is in PROTOCOL_BUFFERS, and every name there is
    allocated by some run (runs cut to 8 iterations: each buffer appears in the first few)."""
    from overlap_harness.runner import simulate
    from overlap_harness.sim.sim_device import SimDevice

    allocated: set[str] = set()
    original = SimDevice.buffer

    def recording(self, name, *args, **kwargs):
        allocated.add(name)
        return original(self, name, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SimDevice, "buffer", recording)
        for sc in load_paths([REPO / "scenarios"]):
            for spec in expand(sc):
                short = dataclasses.replace(sc.workload,
                                            iterations=min(sc.workload.iterations, 8))
                # a configuration the device refuses (HarnessError) is tested elsewhere
                with contextlib.suppress(HarnessError):
                    simulate(dataclasses.replace(sc, protocol=spec.protocol, workload=short),
                             spec.removed)
    assert sorted(n for n in allocated if not is_protocol_buffer(n)) == []
    assert sorted(set(PROTOCOL_BUFFERS) - allocated) == []


def test_workload_references(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, """\
        [workload]
        iterations = 6
        requests = [
          { id = "A", arrive = 0 },
          { id = "A", arrive = 2 },
          { id = "", arrive = 6, prompt_len = 4, chunks = 5 },
          { id = "L", prompt_len = 100, max_new = 40 },
        ]
        events = [
          { at = 6, kind = "idle" },
          { at = 1, kind = "retract", id = "Z" },
          { at = 1, kind = "idle", id = "A" },
          { at = 2, kind = "finish_late" },
          { at = 1, kind = "evict_swa", id = "L" },
        ]
        """)
    assert lines == [
        'x.toml: workload.requests[1].id: "A" is already the id of workload.requests[0]; '
        "request ids must be unique",
        "x.toml: workload.requests[2].id: missing; give every request a unique id",
        "x.toml: workload.requests[2].arrive: 6 is not before workload.iterations = 6, "
        "so the request never runs",
        "x.toml: workload.requests[2].chunks: 5 chunks for a 4-token prompt; "
        "at most prompt_len = 4",
        "x.toml: workload.requests[3].max_new: prompt_len + max_new = 140 exceeds "
        "protocol.max_context = 128",
        "x.toml: workload.events[0].at: 6 is past the last iteration "
        "(workload.iterations = 6, so at most 5)",
        'x.toml: workload.events[1].id: unknown request "Z"; requests are A|L',
        'x.toml: workload.events[2].id: an "idle" event concerns no request; remove id',
        'x.toml: workload.events[3].id: missing; a "finish_late" event concerns a request, '
        "one of A|L",
    ]


def test_event_before_its_request_arrives(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, """\
        [workload]
        requests = [{ id = "B", arrive = 3 }]
        events = [{ at = 1, kind = "retract", id = "B" }]
        """)
    assert lines == ['x.toml: workload.events[0].at: 1 is before request "B" arrives '
                     "(workload.requests[0].arrive = 3)"]


def test_bad_names(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, 'name = "my scenario"\n')
    assert lines == ['x.toml: name: "my scenario" may hold only letters, digits and _ . - '
                     "(it names runs and report files)"]


# --- collecting across problems and files ----------------------------------------------------

def test_every_problem_in_one_file_is_reported() -> None:
    path = str(DATA / "bad_many.toml")
    with pytest.raises(ScenarioError) as info:
        load_paths([path])
    where = [line.removeprefix(f"{path}: ").split(": ")[:2] for line in info.value.problems]
    # the lines, read off tests/data/scenarios/bad_many.toml by hand
    assert where == [["line 5", "protocol.war_barrier"], ["line 6", "protocol.topk"],
                     ["line 7", "protocol.num_stepz"], ["line 13", "workload.requests[1].max_new"],
                     ["line 18", "timing.verify_share"], ["line 15", "workload.events[0].at"],
                     ["line 15", "workload.events[0].id"], ["line 21", "mutation[0].remove[0]"]]
    assert str(info.value) == "\n".join(info.value.problems)
    assert isinstance(info.value, HarnessError)


#: One file per kind of problem the loader finds, each with the line it must name.
EVERY_KIND = [
    (b'[protocol]\nwar_barrier = "loop-top"\n', 2),  # enum
    (b'[protocol]\nnum_stepz = 3\n', 2),  # unknown key
    (b'[protocol]\ntopk = "2"\n', 2),  # type
    (b'[protocol]\ntopk = 0\n', 2),  # range
    (b'name = "a b"\n', 1),  # a rule on one key
    (b'[check]\nexpect = "race"\nraces = ["RAW"]\n', 3),  # race format
    (b'[check]\nexpect = "race"\nraces = ["RAW new_seq_lens_bf"]\n', 3),  # race buffer
    (b'[[mutation]]\nremove = ["war_barier"]\n', 2),  # sync label
    (b'profile = "nope.json"\n', 1),  # a missing profile
    (b'[workload]\niterations = 2\n', 1),  # nothing to run: its table's line
    (b'\n\nx = [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n', 3),
    (b'\xef\xbb\xbfname = "x"\n', 1),  # byte-order mark
    (b'name = "x"\n# caf\xe9\n', 2),  # not UTF-8
    (b'name = "x"\n[protocol\n', 2),  # TOML syntax
]


@pytest.mark.parametrize(("text", "line"), EVERY_KIND)
def test_every_kind_of_problem_names_its_line(text: bytes, line: int, tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_bytes(text)
    with pytest.raises(ScenarioError) as info:
        load_paths([path], runnable=text.startswith(b"[workload]"))
    assert [p.removeprefix(f"{path}: ").split(":")[0].split(",")[0]
            for p in info.value.problems] == [f"line {line}"]


def test_a_name_used_twice_names_the_line_of_the_second(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text('name = "same"\n')
    (tmp_path / "b.toml").write_text('# the same name\n\nname = "same"\n')
    with pytest.raises(ScenarioError) as info:
        load_paths([tmp_path / "a.toml", tmp_path / "b.toml"])
    assert info.value.problems == [f'{tmp_path / "b.toml"}: line 3: name: "same" is already '
                                   f'the name of {tmp_path / "a.toml"}; scenario names must be '
                                   "unique in a suite"]


def test_problems_across_files_and_paths_are_all_reported(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    bad, syntax = str(DATA / "bad_many.toml"), str(DATA / "bad_syntax.toml")
    with pytest.raises(ScenarioError) as info:
        load_paths([tmp_path / "nope.toml", empty, bad, syntax])
    lines = info.value.problems
    assert lines[:2] == [f"{tmp_path / 'nope.toml'}: no such file or folder",
                         f"{empty}: folder holds no .toml scenario files"]
    assert sum(line.startswith(f"{bad}: ") for line in lines) == 8
    assert lines[-1] == f"{syntax}: line 4, column 8: TOML syntax error: Invalid value"


def test_duplicate_names_across_a_suite_name_both_files(monkeypatch) -> None:
    monkeypatch.chdir(DATA)
    with pytest.raises(ScenarioError) as info:
        load_paths(["dupes"])
    assert info.value.problems == [
        'dupes/b.toml: line 1: name: "suite_one" is already the name of dupes/a.toml; '
        "scenario names must be unique in a suite"]


def test_no_paths_is_a_problem() -> None:
    with pytest.raises(ScenarioError) as info:
        load_paths([])
    assert info.value.problems == ["no scenario files given"]


# --- expansion -------------------------------------------------------------------------------

def test_expand_applies_overrides_and_removals() -> None:
    s = load_scenario(DATA / "good.toml")
    base, first, second = expand(s)
    assert (base.mutation_name, base.removed, base.expect) == ("", frozenset(), Expect.RACE_FREE)
    assert base.protocol is s.protocol
    assert first.mutation_name == "publish_ready.schedule_wait"
    assert first.removed == frozenset({"publish_ready.schedule_wait"})
    assert first.protocol == s.protocol and first.expect is Expect.RACE
    assert second.mutation_name == "no_barrier"
    assert second.protocol.war_barrier is WarBarrier.NONE
    assert second.protocol == dataclasses.replace(s.protocol, war_barrier=WarBarrier.NONE)
    assert second.races == ("RAW new_seq_lens_buf",)


def test_run_ids_are_stable_and_follow_behaviour(tmp_path: Path) -> None:
    s = load_scenario(DATA / "good.toml")
    ids = [r.run_id for r in expand(s)]
    assert [r.run_id for r in expand(load_scenario(DATA / "good.toml"))] == ids
    assert re.fullmatch(r"spec_v2_decode_publish_ready/base-[0-9a-f]{8}", ids[0])
    assert ids[2].startswith("spec_v2_decode_publish_ready/no_barrier-")
    assert len({i.rsplit("-", 1)[1] for i in ids}) == 3  # each run behaves differently
    relabelled = dataclasses.replace(s, description="other words", path="elsewhere.toml")
    assert [r.run_id for r in expand(relabelled)] == ids
    slower = dataclasses.replace(s, timing=dataclasses.replace(s.timing, forward=2500.0))
    assert expand(slower)[0].run_id != ids[0]


def test_mutation_name_defaults_to_overrides_without_remove(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text('[[mutation]]\nset = { war_barrier = "none", swa = true }\n')
    runs = expand(load_scenario(tmp_path / "m.toml"))
    assert runs[1].mutation_name == "swa=true+war_barrier=none"
    assert runs[1].protocol.swa is True and runs[1].removed == frozenset()


def test_scenario_to_dict_is_json_with_enum_strings() -> None:
    s = load_scenario(DATA / "good.toml")
    data = json.loads(json.dumps(scenario_to_dict(s)))
    assert data["protocol"]["war_barrier"] == "loop_top"
    assert data["workload"]["events"][0] == {"at": 4, "kind": "retract", "id": "A"}
    assert data["mutation"][1]["set"] == {"war_barrier": "none"}
    assert data["path"] == s.path and data["timing"]["forward"] == 2000.0


# --- key reference ---------------------------------------------------------------------------

def test_committed_key_reference_is_current() -> None:
    committed = (REPO / "docs" / "scenario-keys.md").read_text()
    assert committed == render(), (
        "run: python -m overlap_harness.scenarios.keyref > docs/scenario-keys.md")


def _tables(cls: type, prefix: str, title: str):
    yield cls, title
    for f, tp in all_fields(cls):
        where = f"{prefix}.{f.name}" if prefix else f.name
        elem = element_type(tp)
        if is_table(tp):
            yield from _tables(tp, where, f"[{where}]")
        elif elem is not None and is_table(elem):
            yield from _tables(elem, where, f"[[{where}]]")


def test_every_scenario_field_is_in_the_key_reference() -> None:
    sections = {part.split("\n", 1)[0]: part for part in render().split("\n## ")[1:]}
    checked = 0
    for cls, title in _tables(Scenario, "", "Top level"):
        rows = sections[title]
        for f, _tp in all_fields(cls):
            assert f"| `{f.name}` |" in rows, f"{title} lacks {f.name}"
            checked += 1
    assert checked == sum(len(all_fields(c)) for c, _ in _tables(Scenario, "", "Top level"))
    assert checked > 50


def test_key_in_the_wrong_table_and_tables_of_the_wrong_shape(tmp_path, monkeypatch) -> None:
    lines = problems(tmp_path, monkeypatch, """\
        protocol = 3
        [timing]
        topk = 2
        "war barrier" = 1
        [[mutation]]
        set = "war_barrier=none"
        """)
    assert lines[:3] == [
        "x.toml: protocol: expected a table, got 3",
        "x.toml: timing.topk: unknown key; did you mean protocol.topk?",
        'x.toml: timing."war barrier": unknown key; valid keys: host_launch, schedule_prep, '
        "process_results, schedule_kernel, forward, verify_share, d2h, jitter",
    ]
    assert lines[3:] == ['x.toml: mutation[0].set: expected a table of [protocol] keys, '
                         'got "war_barrier=none"']


def test_a_new_schema_field_is_validated_without_loader_changes() -> None:
    lines: list[str] = []
    raw = {"depth": 4, "mode": "spec", "labels": ["a", 1], "deep": 2}
    values = _keys(raw, FutureTable, "future", Problems("f.toml", lines))
    assert lines == [
        "f.toml: future.depth: expected 1..3, got 4",
        'f.toml: future.mode: expected one of non_spec|spec_v2, got "spec"',
        "f.toml: future.labels[1]: expected a string, got 1",
        "f.toml: future.deep: unknown key; did you mean depth?",
    ]
    assert values == {"labels": ("a",)}  # the valid element is kept; the array is distrusted
