"""The necessity table of SGLang's loop as Markdown: core's page, titled for SGLang."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from overlap_harness.engines.core.report import necessity_markdown
from overlap_harness.engines.sglang.report import site_configs


def markdown(document: dict[str, Any]) -> str:
    """The command's JSON document (with ``necessity``) as a Markdown report: core's table,
    then per site the variants of each verdict and the reasons of the sites no variant
    reaches (:mod:`.report.site_configs`)."""
    rows = document.get("necessity", [])
    page = necessity_markdown(
        f"SGLang {document['sglang_version']}: sync sites of the overlap loop",
        document["source"], document["variants"], rows)
    sites = site_configs.per_site(rows)
    unreached = site_configs.unreached_sites(sites, Path(document["source"]))
    return page + "\n".join(site_configs.markdown(sites, unreached))
