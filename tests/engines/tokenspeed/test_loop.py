"""TokenSpeed 0.1.1's own overlap loop under the recorder: every variant race-free as
released, the committed tokens what the stand-in model computes from the inputs TokenSpeed
fed it (an oracle written here), and the loop's orderings necessary: without the execution
stream's wait on the default stream, or without the output copy's event record, races at
that tree's lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines.tokenspeed.conftest import run_command, tree_copy

EXECUTOR = "runtime/execution/model_executor.py"


def _oracle_next(token: int, vocab: int = 64) -> int:
    return (7 * token + 3) % vocab


def test_every_variant_is_race_free_as_released(tokenspeed_tree: Path) -> None:
    from overlap_harness.engines.tokenspeed.variants import variant_runs

    runs = variant_runs()
    assert len(runs) >= 6
    for name, run in runs.items():
        watcher = run()
        assert watcher.races == [], name
        assert watcher.outputs, name  # something was committed


def test_plain_decode_commits_the_tokens_each_step_fed_back(tokenspeed_tree: Path) -> None:
    """Prefill samples from each prompt's last token; every decode reads the token the
    previous step wrote into the request-pool table (one step behind on the host)."""
    from overlap_harness.engines.tokenspeed.variants import variant_runs

    watcher = variant_runs()["plain_decode"]()
    last = [16, 25, 40]  # the prompts' last tokens (plans.three_requests)
    expected = []
    for _ in range(5):  # the prefill and four decodes
        last = [_oracle_next(t) for t in last]
        expected.append(last)
    assert [tokens for tokens, _ in watcher.outputs] == expected


def test_the_graph_variant_replays_graphs(tokenspeed_tree: Path) -> None:
    from overlap_harness.engines.tokenspeed import driver
    from overlap_harness.engines.tokenspeed.variants import SETUPS

    seen = []
    original = driver.build_executor

    def keep(setup: object) -> object:
        executor = original(setup)
        seen.append(executor)
        return executor
    driver.build_executor = keep
    try:
        watcher = driver.run(SETUPS["cuda_graph_decode"])
    finally:
        driver.build_executor = original
    assert watcher.races == []
    assert seen[0].forward_step.replays == 4


@pytest.mark.parametrize(("edit", "racing_file"), [
    ([("""            self.execution_stream.wait_stream(self.default_stream)
        with self.device_module.stream(self.execution_stream):
            bs = len(forward_op.request_ids)""",
       """            pass
        with self.device_module.stream(self.execution_stream):
            bs = len(forward_op.request_ids)""")], EXECUTOR),
    ([("                copy_event.record()\n", "                pass\n")],
     "runtime/sampling/backends/flashinfer.py"),
], ids=["no-wait-on-default-stream", "no-copy-event-record"])
def test_removing_an_ordering_races_at_the_trees_lines(
        tokenspeed_tree: Path, tmp_path: Path, edit: list, racing_file: str) -> None:
    tree = tree_copy(tokenspeed_tree, tmp_path / "tree", {EXECUTOR: edit})
    status, document = run_command(tree, tmp_path / "out.json", "plain_decode")
    assert status == 1, document["stderr"]
    files = {side["file"] for race in document["races"] for side in (race["first"],
                                                                     race["second"])}
    assert f"tokenspeed/{racing_file}" in files  # named from the tree's root
    assert not any(str(tree) in name for name in files)


def test_a_tree_without_the_forward_thread_is_refused(tokenspeed_tree: Path,
                                                      tmp_path: Path) -> None:
    tree = tree_copy(tokenspeed_tree, tmp_path / "tree", {})
    (tree / "tokenspeed" / "runtime" / "execution" / "forward_thread.py").unlink()
    status, document = run_command(tree, tmp_path / "out.json", "plain_decode")
    assert status == 2
    assert "forward_thread" in document["stderr"].strip().splitlines()[-1]


def test_a_graph_replay_touches_the_pages_it_is_handed(tokenspeed_tree: Path,
                                                       tmp_path: Path) -> None:
    """The decode graph's attention reads the pages a static page list names at each replay:
    without the execution stream's wait on the default stream, a decode round's page zeroing
    races the replay (as it races the eager forward in plain_decode)."""
    tree = tree_copy(tokenspeed_tree, tmp_path / "tree", {EXECUTOR: [(
        """            self.execution_stream.wait_stream(self.default_stream)
        with self.device_module.stream(self.execution_stream):
            bs = len(forward_op.request_ids)""",
        """            pass
        with self.device_module.stream(self.execution_stream):
            bs = len(forward_op.request_ids)""")]})
    status, document = run_command(tree, tmp_path / "out.json", "cuda_graph_decode")
    assert status == 1, document["stderr"]
    replayed = [race for race in document["races"] if "replay" in race["second"]["op"]]
    assert replayed and all(race["tensor"].startswith("executor.token_to_kv_pool")
                            for race in replayed)
