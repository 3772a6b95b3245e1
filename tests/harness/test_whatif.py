"""The what-if table reproduces, from the model alone, the published findings (PROTOCOL.md
§2, §8), on the bundled spec-v2 decode scenario. Every number is computed by a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlap_harness.scenarios.loader import load_scenario
from overlap_harness.whatif import format_rows, whatif

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios/protocol/s03_d2h_waits_publish.toml"


@pytest.fixture(scope="module")
def rows():
    return {r.variant: r for r in whatif(load_scenario(SCENARIO))}


def test_every_variant_is_race_free_with_its_syncs(rows) -> None:
    assert all(r.races == () and r.error is None for r in rows.values())
    assert len(format_rows(list(rows.values()))) == len(rows)


def test_publish_ready_releases_the_host_sooner_than_verify_done(rows) -> None:
    # #25879: both without the WAR barrier, which came later (#26380)
    m_old, m_new = rows["verify_done"].metrics, rows["publish_ready_no_barrier"].metrics
    assert m_new.resolve_stall_ns < m_old.resolve_stall_ns
    assert m_new.host_stall_ns < m_old.host_stall_ns


def test_a_blocking_d2h_on_s_under_the_barrier_waits_for_forward_n_minus_1(rows) -> None:
    # #26376 / #26380: .cpu() on S waits for all of forward n-1; the D2H stream only for verify
    ref, cpu = rows["ref"].metrics, rows["d2h_on_schedule"].metrics
    assert cpu.resolve_stall_ns > 1.5 * ref.resolve_stall_ns
    assert cpu.forward_idle_ns > ref.forward_idle_ns
    assert cpu.iteration_ns > ref.iteration_ns


def test_publishing_after_draft_extend_releases_the_host_later(rows) -> None:
    ref, late = rows["ref"].metrics, rows["publish_after_draft_extend"].metrics
    assert late.resolve_stall_ns > 1.5 * ref.resolve_stall_ns


def test_the_coarse_barrier_costs_more_than_a_read_done_event(rows) -> None:
    # #28363: S waits on read_done instead of all of F
    coarse, fine = rows["ref"].metrics, rows["read_done"].metrics
    assert fine.iteration_ns < coarse.iteration_ns
    assert fine.forward_idle_ns < coarse.forward_idle_ns
