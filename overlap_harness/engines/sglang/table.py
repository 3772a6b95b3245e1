"""The necessity table of SGLang's loop as Markdown: core's page, titled for SGLang."""

from __future__ import annotations

from typing import Any

from overlap_harness.engines.core.report import necessity_markdown


def markdown(document: dict[str, Any]) -> str:
    """The command's JSON document (with ``necessity``) as a Markdown report."""
    return necessity_markdown(
        f"SGLang {document['sglang_version']}: sync sites of the overlap loop",
        document["source"], document["variants"], document.get("necessity", []))
