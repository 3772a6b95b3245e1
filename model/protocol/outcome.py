"""What one protocol run returns to the host: per-request values and debug-check failures.

Plain dataclasses that turn into JSON with :meth:`ProtocolOutcome.to_dict` (iteration keys
become strings there). The oracle (``model.protocol.oracle``) compares two of these, plus the
device's ``observations``, value by value.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class RequestOutcome:
    """One request as the host saw it.

    Args:
        tokens: output token ids, in order, truncated at ``max_new``.
        seq_lens_cpu: per iteration the request was decoded in, the seq_len the host used
            (``resolve_seq_lens_cpu``'s value); None where the backend opted out.
        accept_lens: per decode iteration, the accept length read back from the device.
        finished_at: iteration whose result finished it; None while running at the end.
        retracted_at: iterations at which it was retracted.
        skipped_at: iterations whose batch still held it after it finished (found finished
            late, §7): their results were skipped.
    """

    tokens: list[int] = field(default_factory=list)
    seq_lens_cpu: dict[int, int | None] = field(default_factory=dict)
    accept_lens: dict[int, int] = field(default_factory=dict)
    finished_at: int | None = None
    retracted_at: list[int] = field(default_factory=list)
    skipped_at: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DebugFailure:
    """A debug check that fired: the -1 poison assert, or a harness-side consistency check.

    ``check`` is one of ``"poison_assert"`` (a gather saw -1: SGLANG_IS_IN_CI's assert),
    ``"seq_lens_poison"`` (a seq_lens resolve saw -1: its row had no fresh publish, #30471),
    ``"alloc_overrun"`` (the device seq_len + N ran past the row's allocated columns, §9.11),
    ``"ring_alias"`` (the old FutureMap ring handed a request's slot to another, #13713).
    """

    iteration: int
    request: str
    check: str
    detail: str = ""


@dataclass(slots=True)
class ProtocolOutcome:
    """The host-side result of :func:`model.protocol.run_protocol`.

    Args:
        requests: per request id, its :class:`RequestOutcome`.
        batches: per iteration, the request ids of the batch run, in batch order.
        batch_kinds: per iteration, ``"prefill"``, ``"decode"`` or ``"idle"``.
        debug_failures: every :class:`DebugFailure`, in the order the host saw them.
        skipped_syncs: the ``(label, iteration)`` pairs the device skipped (mutations).
    """

    requests: dict[str, RequestOutcome] = field(default_factory=dict)
    batches: dict[int, list[str]] = field(default_factory=dict)
    batch_kinds: dict[int, str] = field(default_factory=dict)
    debug_failures: list[DebugFailure] = field(default_factory=list)
    skipped_syncs: list[tuple[str, int]] = field(default_factory=list)

    def request(self, rid: str) -> RequestOutcome:
        """The outcome record of ``rid``, created on first use."""
        return self.requests.setdefault(rid, RequestOutcome())

    def failures(self, check: str | None = None) -> list[DebugFailure]:
        """The debug failures, optionally only those of one ``check``."""
        return [f for f in self.debug_failures if check is None or f.check == check]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (iteration keys as strings)."""
        return _jsonable(asdict(self))


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return x
