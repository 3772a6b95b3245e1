"""An independent happens-before oracle, built from STREAM-SEMANTICS.md's rules alone.

It does not import the detector, the simulator or the allocator: it reads a program (a list of
device-API steps, as executed) and builds the happens-before graph by the document's rules,
decides which block each allocation reuses by the rule written in the semantics doc and
``model/allocator.py``'s docstring (most recently freed block of the same numel, dtype, pinned
flag and allocation stream; one with ``record_stream`` only once each recorded stream's last op
at the free happens before the allocating host), then finds races by explicit reachability
over every pair of accesses. The tests compare its race set with the detector's.

Rules (STREAM-SEMANTICS.md):
- program order on each stream and on the host;
- host issue order: everything the host did before issuing an op happens before it;
- record -> wait, bound to the latest record when the wait is issued (none: no edge);
- wait_stream(a, b) = record a fresh event on b, wait on it on a;
- host syncs (event, stream, device; a blocking copy): the synced work happens before the
  host's next action; a sync on a never-recorded event returns at once;
- observations: a query answered True (a recorded event) and a poll loop order the host after
  the event's record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HOST = "host"

Step = tuple  # ("launch", stream, buffer, reads, writes) ... see ProgramOracle.apply


@dataclass
class _Access:
    node: int
    storage: int
    buffer: str
    elements: frozenset[int]
    write: bool
    pinned: bool


@dataclass
class _Block:
    key: tuple
    storage: int
    pending: tuple[int, ...]


@dataclass
class ProgramOracle:
    """Feed executed steps with :meth:`apply`; read :meth:`races`."""

    streams: tuple[str, ...]
    numel: int
    agents: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    preds: list[set[int]] = field(default_factory=list)
    accesses: list[_Access] = field(default_factory=list)
    last_on: dict[str, int] = field(default_factory=dict)
    records: dict[str, int] = field(default_factory=dict)
    storage_of: dict[str, int] = field(default_factory=dict)
    owner_of: dict[str, str] = field(default_factory=dict)
    recorded_streams: dict[str, set[str]] = field(default_factory=dict)
    pool: list[_Block] = field(default_factory=list)
    storages: int = 0
    _ancestors: dict[int, frozenset[int]] = field(default_factory=dict)

    # -- the graph ------------------------------------------------------------------------
    def _node(self, agent: str, name: str, kind: str, extra: tuple[int, ...] = ()) -> int:
        index = len(self.agents)
        preds = set(extra)
        if agent in self.last_on:
            preds.add(self.last_on[agent])
        if agent != HOST and HOST in self.last_on:
            preds.add(self.last_on[HOST])  # host issue order
        self.agents.append(agent)
        self.names.append(name)
        self.kinds.append(kind)
        self.preds.append(preds)
        self.last_on[agent] = index
        return index

    def ancestors(self, node: int) -> frozenset[int]:
        """Every node with a path to ``node`` (explicit reachability, memoised)."""
        if node not in self._ancestors:
            seen: set[int] = set()
            stack = list(self.preds[node])
            while stack:
                n = stack.pop()
                if n not in seen:
                    seen.add(n)
                    stack.extend(self.preds[n])
            self._ancestors[node] = frozenset(seen)
        return self._ancestors[node]

    def _host_knows(self, node: int) -> bool:
        host = self.last_on.get(HOST)
        return host is not None and (node == host or node in self.ancestors(host))

    def _access(self, node: int, buffer: str, elements: range | list[int], write: bool,
                pinned: bool) -> None:
        self.accesses.append(_Access(node, self.storage_of[buffer], buffer,
                                     frozenset(elements), write, pinned))

    # -- the steps ------------------------------------------------------------------------
    def allocate(self, buffer: str, stream: str | None, pinned: bool) -> None:
        """``buffer`` is allocated on ``stream`` (None: the host)."""
        key = (self.numel, pinned, stream)
        self.owner_of[buffer] = stream or HOST
        self.recorded_streams[buffer] = set()
        if not pinned:
            for index in range(len(self.pool) - 1, -1, -1):
                block = self.pool[index]
                if block.key == key and all(self._host_knows(n) for n in block.pending):
                    del self.pool[index]
                    self.storage_of[buffer] = block.storage
                    return
        self.storage_of[buffer] = self.storages
        self.storages += 1

    def apply(self, step: Step) -> None:
        """One executed step; see the module docstring for the rule each one follows."""
        what = step[0]
        if what == "launch":
            _, stream, name, buffer, pinned, reads, writes = step
            node = self._node(stream, name, "kernel")
            self._access(node, buffer, reads, False, pinned)
            self._access(node, buffer, writes, True, pinned)
        elif what == "copy":
            _, stream, name, src, src_pinned, dst, dst_pinned, blocking = step
            node = self._node(stream, name, "copy")
            self._access(node, src, range(self.numel), False, src_pinned)
            self._access(node, dst, range(self.numel), True, dst_pinned)
            if blocking:
                self._node(HOST, f"{name}.sync", "sync", (node,))
        elif what == "host":
            _, name, buffer, elements, write = step
            node = self._node(HOST, name, "host")
            self._access(node, buffer, elements, write, True)
        elif what == "record":
            _, event, stream = step
            self.records[event] = self._node(stream, f"record:{event}", "record")
        elif what == "wait":
            _, stream, event = step
            bound = self.records.get(event)
            self._node(stream, f"wait:{event}", "wait", () if bound is None else (bound,))
        elif what == "wait_stream":
            _, waiter, other = step
            record = self._node(other, "record:tmp", "record")
            self._node(waiter, "wait:tmp", "wait", (record,))
        elif what == "sync":
            self._sync(step[1])
        elif what in ("query", "poll"):
            _, event, outcome = step if what == "query" else (*step, True)
            bound = self.records.get(event)
            if what == "query" or bound is not None:
                edge = (bound,) if outcome and bound is not None else ()
                self._node(HOST, f"{what}:{event}", what, edge)
        elif what == "alloc":
            _, buffer, stream = step
            self.allocate(buffer, stream, False)
        elif what == "record_stream":
            _, buffer, stream = step
            self.recorded_streams[buffer].add(stream)
        elif what == "free":
            _, buffer = step
            owner = self.owner_of[buffer]
            pending = tuple(self.last_on[s] for s in sorted(self.recorded_streams[buffer])
                            if s != owner and s in self.last_on)
            self.pool.append(_Block((self.numel, False, owner if owner != HOST else None),
                                    self.storage_of[buffer], pending))
            self._node(HOST, f"free:{buffer}", "free")
        else:
            raise ValueError(f"unknown step {step!r}")

    def _sync(self, target: str) -> None:
        if target == "device":
            synced = tuple(self.last_on[s] for s in self.streams if s in self.last_on)
            self._node(HOST, "sync:device", "sync", synced)
        elif target in self.streams:
            synced = (self.last_on[target],) if target in self.last_on else ()
            self._node(HOST, f"sync:{target}", "sync", synced)
        elif target in self.records:  # an event; never recorded: returns at once
            self._node(HOST, f"sync:{target}", "sync", (self.records[target],))

    # -- the verdict ----------------------------------------------------------------------
    def races(self) -> set[tuple]:
        """Every racing pair, one entry per element: (kind, first buffer, second buffer,
        first op, second op, element)."""
        found: set[tuple] = set()
        for j, q in enumerate(self.accesses):
            for p in self.accesses[:j]:
                if p.node >= q.node or p.storage != q.storage or not (p.write or q.write):
                    continue
                if self.agents[p.node] == self.agents[q.node]:
                    continue
                if p.node in self.ancestors(q.node):
                    continue
                common = p.elements & q.elements
                if not common:
                    continue
                kind = self._kind(p, q)
                for element in common:
                    found.add((kind, p.buffer, q.buffer, self.names[p.node],
                               self.names[q.node], element))
        return found

    def _kind(self, p: _Access, q: _Access) -> str:
        if p.buffer != q.buffer:
            return "reuse"
        kinds = {self.kinds[p.node], self.kinds[q.node]}
        agents = {self.agents[p.node], self.agents[q.node]}
        if q.pinned and HOST in agents and "copy" in kinds:
            return "host-D2H"
        if p.write:
            return "WAW" if q.write else "RAW"
        return "WAR"
