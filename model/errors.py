"""One error base for the harness, as simpy has ``SimPyException``."""

from __future__ import annotations


class HarnessError(Exception):
    """Base of every error the harness raises on purpose."""


class DeviceUsageError(HarnessError):
    """The protocol used the device API wrongly (a host read of device memory, a freed buffer)."""


class ScenarioError(HarnessError):
    """A scenario file is invalid; ``problems`` holds one line per problem, all of them."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
