"""The installed API works from any folder: ``overlap_harness.watch`` / ``check_script`` /
``declare_kernel`` resolve with only the package folder on the path (what an install
provides), and only the project's packages become ``overlap_harness.<name>``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent("""\
    import importlib.util
    import sys
    from pathlib import Path

    import torch

    import overlap_harness

    ROOT = Path(sys.argv[1])
    for name in ("tests", "tools", "overlap_harness"):
        assert importlib.util.find_spec("overlap_harness." + name) is None, name
    from overlap_harness import recorder
    assert Path(recorder.__file__).resolve().is_relative_to(ROOT), recorder.__file__
    assert overlap_harness.declare_kernel is recorder.declare_kernel

    with overlap_harness.watch(mode="cpu") as w:
        side = torch.cuda.Stream()
        buf = torch.zeros(4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            buf.add_(1)
        total = buf.sum()  # reads what the side stream writes, unordered
    print("watch races", len(w.races))
    script = Path("prog.py")
    script.write_text("import torch\\nx = torch.ones(3, device='cuda')\\nprint(x.sum().item())\\n")
    result = overlap_harness.check_script(script, mode="cpu")
    print("check_script", result.error, len(result.run.timeline) > 0)
    """)


def test_watch_and_check_script_from_another_folder(tmp_path: Path) -> None:
    # The package folder alone on the path, as an install provides it: a bare ``import
    # recorder`` (only resolvable from the repository root) fails here.
    site = tmp_path / "site"
    site.mkdir()
    (site / "overlap_harness").symlink_to(ROOT / "overlap_harness")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(ROOT)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "watch races 1" in done.stdout
    assert "check_script None True" in done.stdout
