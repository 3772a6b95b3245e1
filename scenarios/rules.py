"""Cross-field rules of a scenario, and the problem list the loader fills.

Single keys are checked against the schema by ``scenarios.loader``; the rules here need more
than one key: the topk=1 fast-path shape, references between workload requests and events,
race expectations, mutation labels and overrides. A rule is skipped when a key it reads
already has a problem, so one mistake gives one line, not a cascade.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable

from overlap_harness.model.config import (
    EventKind,
    Expect,
    Mode,
    Platform,
    ProtocolConfig,
    Scenario,
    SeqLensD2H,
)
from overlap_harness.scenarios.expand import mutation_name
from overlap_harness.scenarios.schema import RACE_KINDS, SYNC_LABELS, show

_SCENARIO_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_MUTATION_NAME = re.compile(r"[A-Za-z0-9_.+=-]+")


class Problems:
    """The problems of one file: ``"<path>: <key path>: <reason>"`` lines, in order.

    ``bad`` remembers the key paths that have a problem (or could not be trusted), so the
    rules can skip anything that reads them.
    """

    def __init__(self, path: str, lines: list[str],
                 locate: Callable[[str], int | None] | None = None) -> None:
        self.path = path
        self.lines = lines
        self.locate = locate  # key path -> its line in the file (scenarios.locate)
        self.bad: set[str] = set()

    def add(self, key: str, reason: str) -> None:
        """Record one problem at ``key`` (empty for the file as a whole), with the key's line
        when the file's text places it: ``x.toml: line 7: protocol.topk: reason``."""
        line = self.locate(key) if key and self.locate is not None else None
        where = f"{self.path}: line {line}" if line is not None else self.path
        self.lines.append(f"{where}: {key}: {reason}" if key else f"{where}: {reason}")
        self.bad.add(key)

    def distrust(self, key: str) -> None:
        """Mark ``key`` unusable by the rules without a line of its own (already reported)."""
        self.bad.add(key)

    def trusted(self, key: str) -> bool:
        """Neither ``key`` nor a table or array holding it has a problem."""
        return not any(key == b or key.startswith((b + ".", b + "[")) for b in self.bad)

    def ok(self, *keys: str) -> bool:
        """Every key is trusted and nothing inside it has a problem either."""
        return all(
            self.trusted(k) and not any(b.startswith((k + ".", k + "[")) for b in self.bad)
            for k in keys
        )


def check_scenario(s: Scenario, out: Problems) -> None:
    """Apply every cross-field rule to a scenario built from valid keys; report into ``out``."""
    if out.ok("name") and not _SCENARIO_NAME.fullmatch(s.name):
        out.add("name", f"{show(s.name)} may hold only letters, digits and _ . - "
                        "(it names runs and report files)")
    for field, keys, reason in protocol_violations(s.protocol):
        if out.ok(*(f"protocol.{k}" for k in keys)):
            out.add(f"protocol.{field}", reason)
    _check_workload(s, out)
    _check_expectation(s.check.expect, s.check.races, "check", out)
    for i in range(len(s.mutation)):
        _check_mutation(s, i, out)
    _check_mutation_names(s, out)


def check_runnable(s: Scenario, out: Problems) -> None:
    """A scenario to run must have something to run: an empty file, one without a
    ``[workload]`` and one without requests would run nothing and pass (a silent pass)."""
    if not s.workload.requests and out.ok("workload", "workload.requests"):
        out.add("workload.requests", "none, so the scenario has nothing to run; add "
                                     "[[workload.requests]] with an id, prompt_len and max_new")


def protocol_violations(p: ProtocolConfig) -> list[tuple[str, tuple[str, ...], str]]:
    """Impossible protocol combinations as (key to blame, keys involved, reason).

    Spec-only keys are free in ``non_spec`` mode (they are ignored there), so the spec rules
    only apply to ``spec_v2``.
    """
    found = []
    spec = p.mode is Mode.SPEC_V2
    shape = ("mode", "topk", "num_steps", "num_draft_tokens")
    if spec and p.topk == 1 and p.num_draft_tokens != p.num_steps + 1:
        want = p.num_steps + 1
        found.append(("num_draft_tokens", shape,
                      f"topk = 1 needs num_draft_tokens = num_steps + 1 = {want}, "
                      f"got {p.num_draft_tokens}; set num_draft_tokens = {want}"))
    if spec and p.topk > 1:
        most = 1 + p.topk + (p.num_steps - 1) * p.topk**2
        if p.num_draft_tokens > most:
            found.append(("num_draft_tokens", shape,
                          f"topk = {p.topk} and num_steps = {p.num_steps} draft at most "
                          f"1 + topk + (num_steps - 1)*topk^2 = {most} tokens, "
                          f"got {p.num_draft_tokens}"))
    if spec and p.platform is Platform.HIP and p.seq_lens_d2h is SeqLensD2H.D2H_STREAM:
        found.append(("seq_lens_d2h", ("mode", "platform", "seq_lens_d2h"),
                      'platform = "hip" has no D2H stream (it is CUDA only); '
                      'use "schedule_stream" or "none"'))
    if p.delayed_sampling and spec:
        found.append(("delayed_sampling", ("mode", "delayed_sampling"),
                      'delayed sampling is the non-spec grammar path; set mode = "non_spec"'))
    if p.delayed_stash_after_gather and not p.delayed_sampling:
        found.append(("delayed_stash_after_gather",
                      ("delayed_sampling", "delayed_stash_after_gather"),
                      "moves the delayed-sampling stash, so it needs delayed_sampling = true"))
    return found


def _check_workload(s: Scenario, out: Problems) -> None:
    w = s.workload
    iters = w.iterations if out.ok("workload.iterations") else None
    ids: dict[str, int] = {}
    readable = [out.ok(f"workload.requests[{i}].id") for i in range(len(w.requests))]
    known = all(readable) and out.trusted("workload.requests")  # every id could be read
    for i, r in enumerate(w.requests):
        k = f"workload.requests[{i}]"
        if readable[i]:
            if not r.id:
                out.add(f"{k}.id", "missing; give every request a unique id")
            elif r.id in ids:
                out.add(f"{k}.id", f"{show(r.id)} is already the id of "
                                   f"workload.requests[{ids[r.id]}]; request ids must be unique")
            else:
                ids[r.id] = i
        if iters is not None and out.ok(f"{k}.arrive") and r.arrive >= iters:
            out.add(f"{k}.arrive", f"{r.arrive} is not before workload.iterations = {iters}, "
                                   "so the request never runs")
        if out.ok(f"{k}.chunks", f"{k}.prompt_len") and r.chunks > r.prompt_len:
            out.add(f"{k}.chunks", f"{r.chunks} chunks for a {r.prompt_len}-token prompt; "
                                   f"at most prompt_len = {r.prompt_len}")
        total = r.prompt_len + r.max_new
        if out.ok(f"{k}.prompt_len", f"{k}.max_new", "protocol.max_context") and (
            total > s.protocol.max_context
        ):
            out.add(f"{k}.max_new", f"prompt_len + max_new = {total} exceeds "
                                    f"protocol.max_context = {s.protocol.max_context}")
    names = "|".join(ids) if ids else "(none: the workload has no requests)"
    for j, e in enumerate(w.events):
        k = f"workload.events[{j}]"
        if iters is not None and out.ok(f"{k}.at") and e.at >= iters:
            out.add(f"{k}.at", f"{e.at} is past the last iteration (workload.iterations = "
                               f"{iters}, so at most {iters - 1})")
        if not out.ok(f"{k}.kind", f"{k}.id"):
            continue
        if e.kind is EventKind.IDLE and e.id:
            out.add(f"{k}.id", 'an "idle" event concerns no request; remove id')
        elif e.kind is not EventKind.IDLE and not e.id:
            out.add(f"{k}.id", f"missing; a {show(e.kind.value)} event concerns a request, "
                               f"one of {names}")
        elif e.id and known and e.id not in ids:
            out.add(f"{k}.id", f"unknown request {show(e.id)}; requests are {names}")
        elif e.id in ids:
            r = w.requests[ids[e.id]]
            if out.ok(f"{k}.at", f"workload.requests[{ids[e.id]}].arrive") and e.at < r.arrive:
                out.add(f"{k}.at", f"{e.at} is before request {show(e.id)} arrives "
                                   f"(workload.requests[{ids[e.id]}].arrive = {r.arrive})")


def _check_expectation(expect: Expect, races: tuple[str, ...], prefix: str, out: Problems) -> None:
    kinds = "|".join(RACE_KINDS)
    for i, race in enumerate(races):
        parts = race.split()
        if len(parts) == 2 and parts[0] in RACE_KINDS:
            continue
        hint = ""
        if parts and parts[0] not in RACE_KINDS:
            close = [k for k in RACE_KINDS if k.lower() == parts[0].lower()]
            hint = f"; did you mean {close[0]}?" if close else ""
        out.add(f"{prefix}.races[{i}]",
                f'expected "KIND buffer" with KIND one of {kinds}, got {show(race)}{hint}')
    if expect is not Expect.RACE and races and out.trusted(f"{prefix}.races") and out.ok(
        f"{prefix}.expect"
    ):
        out.add(f"{prefix}.races", f'expect = "{expect}" contradicts {len(races)} expected '
                                   'race(s); set expect = "race" or races = []')


def _check_mutation(s: Scenario, i: int, out: Problems) -> None:
    m, k = s.mutation[i], f"mutation[{i}]"
    listed: set[str] = set()
    for j, label in enumerate(m.remove):
        if label not in SYNC_LABELS:
            close = difflib.get_close_matches(label, SYNC_LABELS, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            out.add(f"{k}.remove[{j}]", f"unknown sync label {show(label)}; {hint}"
                                        f"valid labels: {'|'.join(SYNC_LABELS)}")
        elif label in listed:
            out.add(f"{k}.remove[{j}]", f"{show(label)} is listed twice")
        listed.add(label)
    if not m.remove and not m.set and out.ok(f"{k}.remove", f"{k}.set"):
        out.add(k, "removes no sync and sets no key, so it repeats the base run; "
                   "add remove = [...] or set = {...}")
    _check_expectation(m.expect, m.races, k, out)
    if not m.set:
        return
    resolved = dataclasses.replace(s.protocol, **m.set)
    for field, keys, reason in protocol_violations(resolved):
        touched = sorted(set(keys) & m.set.keys())
        involved = [f"{k}.set.{x}" if x in m.set else f"protocol.{x}" for x in keys]
        if touched and out.ok(*involved):
            blame = field if field in m.set else touched[0]
            out.add(f"{k}.set.{blame}", f"with this override, {reason}")


def _check_mutation_names(s: Scenario, out: Problems) -> None:
    seen: dict[str, int] = {}
    for i, m in enumerate(s.mutation):
        k = f"mutation[{i}]"
        key = f"{k}.name" if m.name else k
        if not out.ok(f"{k}.name", f"{k}.remove", f"{k}.set"):
            continue
        name = mutation_name(m)
        what = show(name) if m.name else f"its name {show(name)} (from remove/set)"
        if name == "base":
            out.add(key, f'{what} is reserved for the run without mutation; choose another name')
        elif not _MUTATION_NAME.fullmatch(name):
            out.add(key, f"{what} may hold only letters, digits and _ . + = - "
                         "(it names runs and report files)")
        elif name in seen:
            out.add(key, f"{what} is already the name of mutation[{seen[name]}]; "
                         "mutation names must be unique, set name = ...")
        else:
            seen[name] = i
