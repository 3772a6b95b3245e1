"""Happens-before race detector: vector clocks over agents, element-precise access state.

Plain Python and numpy, fed by a device in host issue order (``SimDevice`` feeds it live; a
trace recorded on a GPU can be replayed into it), so it has no notion of simulated time
beyond the access times it is handed for the latent/manifest call.

Every op (a kernel, a copy, an event record, a stream wait, a host sync, a host access) is a
node on one agent: the host (agent 0) or a stream. HB is the transitive closure of
program order per agent, host issue order (the host's past happens before every op it
issues), record -> wait, and completion -> host sync (STREAM-SEMANTICS.md). Each node gets a
vector clock; node u happens before node v iff ``vc(v)[agent(u)] >= epoch(u)``.

Per memory block (storage) and element, the detector keeps, for every agent, the clock and op
of that agent's latest write and latest read. A new access races with agent X's latest
conflicting access exactly when that access is unordered with it: X's earlier accesses are
program-ordered before its latest, so if the latest happens before the new access, they all do.
So the latest conflicting access of each other agent, per element, decides *whether* an access
races. A user who fixes that pair may meet an older one, though (``s0 writes x; s0 writes x;
s1 writes x`` has two racing pairs), so every pair is listed: each agent also keeps, per
storage, a log of its accesses, and once a race with an agent's latest access is found the log
is walked back over the accesses that are unordered with the new one (epoch above what the new
access's clock knows of that agent); those that conflict are reported too, flagged ``older``
(hidden behind a later access of the same agent). Entries every agent's clock has passed can
never race again and are dropped. Races are grouped by (kind, buffer, op pair). Checks are
vectorised over element ids.

Program edges and observations (STREAM-SEMANTICS.md). ``joins`` are program edges (a host sync,
a bound wait). ``observed`` joins are what the host learned at run time (a ``query()`` that
returned True, a poll loop that ended): they order the same way, but the graph tags them, so a
reader can tell which orderings the program text guarantees and which one run observed.

Representation, chosen for speed (a few agents, many small accesses): vector clocks are plain
lists of ints (a join over a handful of agents is cheaper in Python than a numpy call), node
snapshots are tuples. Per element the detector stores only the op of each agent's latest read
and write; that access's clock is the op's epoch (``vc[agent]`` right after the op ticked), so
it is looked up from the epoch table when a check needs it. Per storage, the largest write and
read clock of each agent lets most accesses skip the element-level check: an access can race
only if some agent wrote (or read) the block later than this node's clock knows.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from overlap_harness.model.errors import DeviceUsageError
from overlap_harness.model.node_rows import (  # re-exported: the detector's public names
    AccessReq,
    AccessRow,
    NodeAccesses,
    NodeInfo,
    NodeRow,
    NodeTable,
    collector_paused,
    node_info,
    node_row,
)
from overlap_harness.model.trace import HOST, Access, OpId, OpKind, Race, RaceKind

if TYPE_CHECKING:  # annotations only: graph() imports networkx when called
    import networkx as nx

__all__ = ["DROP_HISTORY_EVERY", "HOST_AGENT", "MAX_AGENTS", "AccessReq", "AccessRow",
           "HBDetector", "NodeAccesses", "NodeInfo", "NodeRow", "NodeTable",
           "collector_paused"]

MAX_AGENTS = 16
HOST_AGENT = 0
LOG_PRUNE_EVERY = 64  # an agent's access log of a storage is pruned when it doubles past this
MAX_OLDER_SCAN = 1024  # log entries walked back per racing agent (counted when cut short)
DROP_HISTORY_EVERY = 4096  # nodes fed between drops of old history (history=False)


class _Storage:
    """Per-agent, per-element op of the latest read and write of one memory block (-1: none),
    per agent the clock of its latest write and read of any element, and per agent the log of
    its accesses (epoch, op, elements, write), oldest first, for the older racing pairs.

    The op arrays are agent-major, (agents, elements), with each agent's row kept as a view:
    recording an access is then a 1-D scatter, a third of the cost of a strided 2-D one. The
    row views are made on an agent's first access (None before): a run allocates tens of
    thousands of blocks, and 32 views each cost more than the block's arrays. The arrays have
    one row per agent registered so far (:meth:`grow` adds rows for streams created later),
    not :data:`MAX_AGENTS`, and hold int32 op ids: the shadow memory of a large pool is then
    8 bytes per element and agent, not 128 per element."""

    __slots__ = ("agents", "logs", "pruned_at", "r_op", "r_rows", "rmax", "shape", "w_op",
                 "w_rows", "wmax")

    def __init__(self, numel: int, shape: tuple[int, ...], agents: int) -> None:
        self.shape = shape
        self.agents = agents
        self.w_op = np.full((agents, numel), -1, dtype=np.int32)
        self.r_op = np.full((agents, numel), -1, dtype=np.int32)
        self.w_rows: list[np.ndarray | None] = [None] * MAX_AGENTS
        self.r_rows: list[np.ndarray | None] = [None] * MAX_AGENTS
        self.wmax = [0] * MAX_AGENTS
        self.rmax = [0] * MAX_AGENTS
        self.logs: list[list[tuple[int, int, np.ndarray, bool]] | None] = [None] * MAX_AGENTS
        self.pruned_at = [LOG_PRUNE_EVERY] * MAX_AGENTS  # log length that triggers a prune

    def grow(self, agents: int) -> None:
        """Rows for the agents registered since the arrays were made (no access yet: -1)."""
        extra = np.full((agents - self.agents, self.w_op.shape[1]), -1, dtype=np.int32)
        self.w_op = np.concatenate([self.w_op, extra])
        self.r_op = np.concatenate([self.r_op, extra])
        self.w_rows = [None] * MAX_AGENTS  # views of the old arrays
        self.r_rows = [None] * MAX_AGENTS
        self.agents = agents


class HBDetector:
    """Vector-clock happens-before detector; see the module docstring for the rules.

    ``history=False`` is the opt-in mode for long runs: a node's row, accesses and clock are
    dropped once every agent's clock has passed it (it can never race again), every
    :data:`DROP_HISTORY_EVERY` nodes; the rows of the nodes a race names are copied when it is
    found, so :attr:`races` is the same. No edges are kept, and :meth:`graph` and
    :meth:`happens_before` refuse. What stays per node is a few array entries (its epoch, and
    a list slot for each table). The default keeps everything: the graph, the GPU replay's
    gates (``node_accesses``) and the reports' timeline read every node.

    ``shadow=False`` is for a device whose every access is ordered by construction, the
    serial oracle (``SimDevice(serial=True)``: one stream, and a host sync joins each op before
    the host issues the next, so no two accesses are unordered and no check can fire): the
    per-element state and the checks are skipped, and :attr:`races` stays empty. The clocks,
    rows and edges are kept: the allocator's reuse test (:meth:`host_knows`) still needs them,
    since a record or wait node is not followed by a sync."""

    def __init__(self, history: bool = True, shadow: bool = True) -> None:
        # history=False: the opt-in mode for long runs (see the class docstring)
        self.history = history
        self.shadow = shadow  # False: no element-level checks (see the class docstring)
        self.agent_names: list[str] = [HOST]
        self._vc: list[list[int]] = [[0] * MAX_AGENTS]
        self._host_version = 0
        self._joined_host: list[int] = [0]
        self._last: list[OpId | None] = [None]
        self._events: dict[object, tuple[tuple[int, ...], OpId]] = {}
        self._storages: dict[int, _Storage] = {}
        self.nodes = NodeTable()
        self.node_accesses = NodeAccesses()  # per node, as declared
        # over the agents registered at the time (None: dropped, history=False)
        self.node_vc: list[tuple[int, ...] | None] = []
        self.node_epoch = array("q")  # each node's epoch (its agent's clock entry)
        # node_epoch as an array, shifted by one so that op -1 (no access) reads epoch 0
        self._epochs = np.zeros(1024, dtype=np.int64)
        self.edges: list[tuple[int, int]] = []  # program edges (and program order)
        self.observation_edges: list[tuple[int, int]] = []  # what the host observed
        # races not yet read, as plain tuples of ints, strings and bools (untracked by the
        # cyclic GC, see NodeTable); :attr:`races` builds their Race records when read
        self._race_rows: list[tuple] = []
        self._races: list[Race] = []
        self.older_scan_truncated = 0  # log walks cut at MAX_OLDER_SCAN entries
        # history=False: per agent, its nodes whose rows are still kept, oldest first; the
        # rows and accesses of the nodes a race names, copied when it is found
        self._live: list[deque[int]] = [deque()]
        self._kept: dict[int, tuple[NodeRow, tuple[AccessRow, ...]]] = {}
        self._fed_since_drop = 0

    # -- agents and memory ----------------------------------------------------------------
    def add_agent(self, name: str) -> int:
        """Register a stream; returns its agent index."""
        if len(self.agent_names) >= MAX_AGENTS:
            raise DeviceUsageError(f"more than {MAX_AGENTS - 1} streams: {name!r}")
        self.agent_names.append(name)
        self._vc.append([0] * MAX_AGENTS)
        self._joined_host.append(-1)
        self._last.append(None)
        self._live.append(deque())
        return len(self.agent_names) - 1

    def add_storage(self, storage: int, numel: int, shape: tuple[int, ...]) -> None:
        """Register a memory block before its first access."""
        if self.shadow:
            self._storages[storage] = _Storage(numel, shape, len(self.agent_names))

    # -- the feed -------------------------------------------------------------------------
    def on_op(
        self,
        info: NodeInfo,
        accesses: Sequence[AccessReq] = (),
        joins: Sequence[OpId] = (),
        observed: Sequence[OpId] = (),
    ) -> None:
        """A node on ``info.agent``: checks and records its accesses.

        ``joins`` are nodes that happen before this one by program edges beyond program and
        issue order (the synced work of a host sync, a wait's bound record). ``observed`` are
        nodes the host saw complete at run time before this node (a ``query()`` that returned
        True, the end of a poll loop): they order alike, and are kept apart in the graph.
        """
        self.feed(node_row(info), tuple([tuple(a) for a in accesses]), joins, observed)

    def feed(
        self,
        row: NodeRow,
        accesses: tuple[AccessRow, ...] = (),
        joins: Sequence[OpId] = (),
        observed: Sequence[OpId] = (),
    ) -> None:
        """:meth:`on_op` without the records: ``row`` is the node as a :data:`NodeRow` and
        ``accesses`` its declared accesses as plain :data:`AccessRow` tuples (kept as given).
        The simulator's issue path calls this: one plain tuple per op, which the cyclic GC
        stops tracking, instead of a record per op and per access."""
        op = row[0]
        a = row[2]
        vc = self._vc[a]
        n_agents = len(self.agent_names)
        history = self.history
        edges = self.edges
        if a != HOST_AGENT:
            if self._joined_host[a] != self._host_version:
                _join(vc, self._vc[HOST_AGENT], n_agents)
                self._joined_host[a] = self._host_version
            host_last = self._last[HOST_AGENT]
            if host_last is not None and history:
                edges.append((host_last, op))
        node_vc = self.node_vc
        for j in joins:
            joined = node_vc[j]
            if joined is not None:  # None: dropped, every agent knows it (_drop_history)
                _join(vc, joined, n_agents)
            if history:
                edges.append((j, op))
        for j in observed:
            joined = node_vc[j]
            if joined is not None:
                _join(vc, joined, n_agents)
            if history:
                self.observation_edges.append((j, op))
        epoch = vc[a] + 1
        vc[a] = epoch
        node_epoch = self.node_epoch
        if op != len(node_epoch):
            raise DeviceUsageError(f"node ids must be dense and in issue order, got {op}")
        last = self._last[a]
        if last is not None and history:
            edges.append((last, op))
        self._last[a] = op
        self.nodes._rows.append(row)
        self.node_accesses._rows.append(accesses)
        node_vc.append(tuple(vc[:n_agents]))  # agents registered later read as 0
        node_epoch.append(epoch)
        epochs = self._epochs
        if op + 1 >= len(epochs):
            epochs = self._epochs = np.concatenate([epochs, np.zeros_like(epochs)])
        epochs[op + 1] = epoch
        if a == HOST_AGENT:
            self._host_version += 1
        if self.shadow:
            for acc in accesses:
                if acc[3].size:
                    self._check(op, a, acc, vc, n_agents)
        if not history:
            self._live[a].append(op)
            self._fed_since_drop += 1
            if self._fed_since_drop >= DROP_HISTORY_EVERY:
                self._drop_history(n_agents)

    def _drop_history(self, n_agents: int) -> None:
        """history=False: drop the row, accesses and clock of every node that every agent's
        clock has passed. Such a node happens before every node still to come (a stream that
        has not run yet joins the host's clock first), so it can never race again, and
        joining its clock changes nothing (any clock that knows it knows all it knew)."""
        self._fed_since_drop = 0
        vcs = [self._vc[x] for x in range(n_agents)
               if x == HOST_AGENT or self._joined_host[x] != -1]  # streams that ran
        rows, accesses, clocks = self.nodes._rows, self.node_accesses._rows, self.node_vc
        node_epoch = self.node_epoch
        for agent in range(n_agents):
            live = self._live[agent]
            floor = min(vc[agent] for vc in vcs)
            while live and node_epoch[live[0]] <= floor:
                op = live.popleft()
                rows[op] = accesses[op] = clocks[op] = None

    def on_record(self, key: object, info: NodeInfo) -> None:
        """An event record: a node on the stream whose clock the event captures."""
        self.feed_record(key, node_row(info))

    def on_wait(self, key: object, info: NodeInfo) -> None:
        """A stream wait: binds to the record that is latest now; no-op if never recorded."""
        self.feed_wait(key, node_row(info))

    def feed_record(self, key: object, row: NodeRow) -> None:
        """:meth:`on_record` of a :data:`NodeRow`."""
        self.feed(row)
        self._events[key] = (self.node_vc[row[0]], row[0])

    def forget_event(self, key: object) -> None:
        """The event ``key`` is never waited on again (a ``wait_stream``'s own event): its
        record is dropped, so a long run keeps none per wait."""
        self._events.pop(key, None)

    def feed_wait(self, key: object, row: NodeRow) -> None:
        """:meth:`on_wait` of a :data:`NodeRow`."""
        rec = self._events.get(key)
        self.feed(row, (), () if rec is None else (rec[1],))

    def last_op(self, agent: int) -> OpId | None:
        """The latest node issued on ``agent`` (what a stream sync or wait_stream captures)."""
        return self._last[agent]

    def host_knows(self, op: OpId) -> bool:
        """True when ``op`` happens before everything the host issues from now on (the
        allocator's reuse test, by program edges: :mod:`model.allocator`)."""
        row = self.nodes._rows[op]
        if row is None:  # dropped (history=False): every agent, the host too, knows it
            return True
        return self._vc[HOST_AGENT][row[2]] >= self.node_epoch[op]

    def event_op(self, key: object) -> OpId | None:
        """The record node an event currently captures, or None if never recorded."""
        rec = self._events.get(key)
        return None if rec is None else rec[1]

    # -- queries --------------------------------------------------------------------------
    @property
    def races(self) -> list[Race]:
        """Every racing pair found so far, in the order found (records built when read)."""
        built = self._races
        rows = self._race_rows
        if rows:
            infos: dict = {}  # one record per node (and per node access) while building
            with collector_paused():
                built.extend([self._race(infos, *row) for row in rows])
            rows.clear()  # built: the rows are not kept twice
        return built

    def happens_before(self, u: int, v: int) -> bool:
        """True when node ``u`` happens before node ``v`` (u != v)."""
        self._need_history("happens_before")
        clock = self.node_vc[v]
        agent = self.nodes.agent(u)  # an agent registered after v was issued: u is later
        return agent < len(clock) and clock[agent] >= self.node_epoch[u] and u != v

    def graph(self) -> nx.DiGraph:
        """The happens-before graph: nodes are ops (with their attributes), edges direct HB."""
        self._need_history("graph")
        import networkx as nx  # deferred: 0.16 s of every start-up, and only graph() needs it

        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(n.op, name=n.name, agent=n.agent_name, kind=str(n.kind),
                       iteration=n.iteration, label=n.label)
        g.add_edges_from(self.edges, kind="program")
        g.add_edges_from(self.observation_edges, kind="observation")
        return g

    def _need_history(self, what: str) -> None:
        if not self.history:
            raise DeviceUsageError(f"{what} needs every node: this detector keeps no history "
                                   "(history=False drops what can no longer race)")

    # -- the check ------------------------------------------------------------------------
    def _check(self, op: int, a: int, acc: AccessRow, vc: list[int], n_agents: int) -> None:
        st = self._storages[acc[0]]
        if st.agents < n_agents:
            st.grow(n_agents)
        e = acc[3]
        write = acc[4]
        if _exceeds(st.wmax, vc, n_agents):
            self._report(op, acc, st.w_op, vc, n_agents, prior_write=True)
        if write:
            if _exceeds(st.rmax, vc, n_agents):
                self._report(op, acc, st.r_op, vc, n_agents, prior_write=False)
            row = st.w_rows[a]
            if row is None:
                row = st.w_rows[a] = st.w_op[a]
            row[e] = op
            st.wmax[a] = vc[a]
        else:
            row = st.r_rows[a]
            if row is None:
                row = st.r_rows[a] = st.r_op[a]
            row[e] = op
            st.rmax[a] = vc[a]
        log = st.logs[a]
        if log is None:
            log = st.logs[a] = []
        log.append((vc[a], op, e, write))
        if len(log) >= st.pruned_at[a]:
            self._prune(st, a, n_agents)

    def _prune(self, st: _Storage, agent: int, n_agents: int) -> None:
        """Drop the log entries of ``agent`` that every agent's clock has passed: they happen
        before every access still to come (a stream registered later starts from the host's
        clock), so they can never race again."""
        floor = min(self._vc[x][agent] for x in range(n_agents))
        log = st.logs[agent]
        keep = 0
        while keep < len(log) and log[keep][0] <= floor:
            keep += 1
        if keep:
            del log[:keep]
        st.pruned_at[agent] = max(LOG_PRUNE_EVERY, 2 * len(log))

    def _report(
        self,
        op: int,
        acc: AccessRow,
        ops: np.ndarray,
        vc: list[int],
        n_agents: int,
        prior_write: bool,
    ) -> None:
        storage, buffer_id, buffer, e, write, pinned = acc
        latest = ops[:n_agents].take(e, axis=1)  # (agents, n): each one's latest op, or -1
        clk = self._epochs[latest + 1]  # that access's clock (0 where there was none)
        unordered = clk > np.array(vc[:n_agents])[:, None]  # own row never exceeds own clock
        if not unordered.any():
            return
        cols, rows = np.nonzero(unordered)  # cols: agents, rows: positions in e
        pairs: dict[int, set[int]] = {}
        for prior, element in zip(latest[cols, rows].tolist(), e[rows].tolist(), strict=True):
            found = pairs.get(prior)
            if found is None:
                pairs[prior] = {element}
            else:
                found.add(element)
        latest_ops = set(pairs)
        st = self._storages[storage]
        new_elements = set(e.tolist())
        for agent in set(cols.tolist()):
            self._older_pairs(st.logs[agent] or [], vc[agent], op, new_elements, prior_write,
                              pairs)
        if not self.history:  # the rows a race record needs outlive the history
            kept, rows, accesses = self._kept, self.nodes._rows, self.node_accesses._rows
            for node in (op, *pairs):
                if node not in kept:
                    kept[node] = (rows[node], accesses[node])
        for p in sorted(pairs):
            elems = tuple(sorted(pairs[p]))
            self._race_rows.append((p, op, storage, buffer_id, buffer, write, pinned, elems,
                                    prior_write, p not in latest_ops))

    def _older_pairs(self, log: list[tuple[int, int, np.ndarray, bool]], known: int, op: int,
                     new_elements: set[int], prior_write: bool,
                     pairs: dict[int, set[int]]) -> None:
        """Add to ``pairs`` every access in ``log`` (one agent's, newest last) that is unordered
        with the new access (epoch above ``known``, what its clock knows of that agent),
        conflicts with it (mode ``prior_write``) and shares elements with ``new_elements``.
        (A set intersection: ``np.intersect1d`` sorts both sides, ten times the cost for the
        few dozen elements of a typical access.)"""
        index = len(log) - 1
        scanned = 0
        while index >= 0 and log[index][0] > known:
            if scanned == MAX_OLDER_SCAN:
                self.older_scan_truncated += 1
                return
            _epoch, prior, elems, write = log[index]
            if write == prior_write and prior != op:
                common = new_elements.intersection(elems.tolist())
                if common:
                    pairs.setdefault(prior, set()).update(common)
            index -= 1
            scanned += 1

    def _node_record(self, op: int) -> NodeInfo:
        kept = self._kept.get(op)
        return self.nodes[op] if kept is None else node_info(kept[0])

    def _buffer_of(self, op: int, storage: int) -> tuple[str, int]:
        """(name, buffer id) through which node ``op`` last accessed ``storage``."""
        kept = self._kept.get(op)
        for fields in reversed(self.node_accesses.rows(op) if kept is None else kept[1]):
            if fields[0] == storage:
                return fields[2], fields[1]
        raise KeyError(storage)  # a prior access the node never declared: a detector bug

    def _race(self, infos: dict, prior: int, op: int, storage: int,
              buffer_id: int, buffer: str, write: bool, pinned: bool, elems: tuple[int, ...],
              prior_write: bool, older: bool) -> Race:
        """The record of one racing pair: node ``prior``'s access (a write when
        ``prior_write``) and node ``op``'s access of ``buffer`` (a write when ``write``).
        ``infos`` caches node and access records across the calls of one build."""
        p = infos.get(prior)
        if p is None:
            p = infos[prior] = self._node_record(prior)
        q = infos.get(op)
        if q is None:
            q = infos[op] = self._node_record(op)
        p_buf, p_buf_id = self._buffer_of(prior, storage)
        if p_buf_id != buffer_id:
            kind = RaceKind.REUSE
        elif pinned and HOST_AGENT in (p.agent, q.agent) and OpKind.COPY in (p.kind, q.kind):
            kind = RaceKind.HOST_D2H
        elif prior_write:
            kind = RaceKind.WAW if write else RaceKind.RAW
        else:
            kind = RaceKind.WAR
        p_mode = "write" if prior_write else "read"
        q_mode = "write" if write else "read"
        manifest = _inverted(p, p_mode, q, q_mode)
        shape = self._storages[storage].shape
        # one Access record per (node, mode, buffer) across a build: a node races many times
        first = infos.get((prior, p_mode, p_buf))
        if first is None:
            first = infos[(prior, p_mode, p_buf)] = _access(p, p_mode, p_buf)
        second = infos.get((op, q_mode, buffer))
        if second is None:
            second = infos[(op, q_mode, buffer)] = _access(q, q_mode, buffer)
        if kind == RaceKind.REUSE:
            return Race(kind, p_buf, shape, elems, first, second, manifest, buffer, older)
        return Race(kind, buffer, shape, elems, first, second, manifest, older=older)


def _join(vc: list[int], other: Sequence[int], n_agents: int) -> None:
    """``vc = max(vc, other)`` in place, over the first ``n_agents`` entries (the rest are 0
    in every clock: no op has run on an agent not yet registered). A node's clock is kept
    only over the agents that existed when it ran (``other`` may be shorter)."""
    for x in range(min(n_agents, len(other))):
        if other[x] > vc[x]:
            vc[x] = other[x]


def _exceeds(mx: list[int], vc: list[int], n_agents: int) -> bool:
    """True when some agent's entry of ``mx`` is ahead of ``vc`` (an access ``vc`` does not
    know of). A plain loop: ``any()`` over a generator costs twice as much here."""
    for x in range(n_agents):  # noqa: SIM110
        if mx[x] > vc[x]:
            return True
    return False


def _access_time(n: NodeInfo, mode: str) -> int | None:
    return n.end_ns if mode == "write" else n.start_ns


def _inverted(p: NodeInfo, p_mode: str, q: NodeInfo, q_mode: str) -> bool | None:
    """Did q's access take effect before p's, against issue order? Writes land at op end and
    take effect before reads at the same instant (the value engine's tie rule)."""
    tp, tq = _access_time(p, p_mode), _access_time(q, q_mode)
    if tp is None or tq is None:
        return None
    return (tq, q_mode == "read") < (tp, p_mode == "read")


def _access(n: NodeInfo, mode: str, buffer: str) -> Access:
    return Access(n.op, n.name, n.agent_name, buffer, mode, n.iteration, n.source, n.label,
                  _access_time(n, mode))
