"""``loop_report.short_site``: a site named from the sglang package folder on, wherever the
tree lies (a GPU run's probe matches the loop report's race sides by that tail), and one of
the harness's own files from the overlap_harness folder on, wherever the checkout lies."""

from __future__ import annotations

import pytest

from overlap_harness.engines.sglang.report.loop_report import short_site


@pytest.mark.parametrize(("site", "short"), [
    ("/root/.cache/overlap-harness/sglang/0.5.23/sglang/srt/managers/scheduler.py:4722",
     "sglang/srt/managers/scheduler.py:4722"),
    ("/root/.cache/overlap-harness/sglang/0.5.23/sglang/kernels/ops/kvcache/copy_pages.py:61",
     "sglang/kernels/ops/kvcache/copy_pages.py:61"),
    ("/home/me/sglang/python/sglang/srt/utils/common.py:616", "sglang/srt/utils/common.py:616"),
    # the harness's adapter package is not SGLang's: named from overlap_harness/ on
    ("/work/main/overlap_harness/engines/sglang/stand_ins/model_worker.py:10",
     "overlap_harness/engines/sglang/stand_ins/model_worker.py:10"),
    ("/tmp/sglang/overlap_harness/engines/sglang/srt/x.py:4",
     "overlap_harness/engines/sglang/srt/x.py:4"),
    ("prog.py:3", "prog.py:3"),
])
def test_a_site_is_named_from_the_package_folder_on(site, short):
    assert short_site(site) == short
