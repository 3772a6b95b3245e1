"""Happens-before race detector: vector clocks over agents, element-precise access state.

Plain Python, numpy and one compiled pass, fed by a device in host issue order
(``SimDevice`` feeds it live; a trace recorded on a GPU can be replayed into it), so it has no
notion of simulated time beyond the access times it is handed for the latent/manifest call.

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
s1 writes x`` has two racing pairs), so every pair is listed: per element, each agent's
accesses are chained newest first, and once a race with an agent's latest access is found the
chain is walked back over the accesses that are unordered with the new one (epoch above what
the new access's clock knows of that agent); those that conflict are reported too, flagged
``older`` (hidden behind a later access of the same agent). Accesses every agent's clock has
passed can never race again and are dropped. Races are grouped by (kind, buffer, op pair).

Program edges and observations (STREAM-SEMANTICS.md). ``joins`` are program edges (a host sync,
a bound wait). ``observed`` joins are what the host learned at run time (a ``query()`` that
returned True, a poll loop that ended): they order the same way, but the graph tags them, so a
reader can tell which orderings the program text guarantees and which one run observed.

Representation, chosen for speed (a few agents, many small accesses): vector clocks are plain
lists of ints, computed as each node is fed (a join over a handful of agents is cheaper in
Python than a numpy call; the allocator's reuse test and the event bindings need them at
once), node snapshots are tuples. The element-level work is deferred: a node's accesses are
queued, and :mod:`overlap_harness.model.shadow` checks the queue in one compiled pass
(:data:`CHECK_EVERY` nodes at a time, and whenever :attr:`HBDetector.races` is read), in
issue order, with each node's clock as it was fed, so the pairs found are those a check per
access finds. Per element the shadow memory keeps only the op of each agent's latest read and
write; that access's clock is the op's epoch (``vc[agent]`` right after the op ticked).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

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
from overlap_harness.model.shadow import (
    MAX_AGENTS,
    RacingPairs,
    ShadowMemory,
    compiled_available,
    compiled_loaded,
)
from overlap_harness.model.shadow_per_access import PerAccessShadow, RaceRows
from overlap_harness.model.trace import HOST, Access, OpId, OpKind, Race, RaceKind

if TYPE_CHECKING:  # annotations only: graph() imports networkx when called
    import networkx as nx

__all__ = ["DROP_HISTORY_EVERY", "HOST_AGENT", "MAX_AGENTS", "AccessReq", "AccessRow",
           "HBDetector", "NodeAccesses", "NodeInfo", "NodeRow", "NodeTable",
           "collector_paused"]

HOST_AGENT = 0
DROP_HISTORY_EVERY = 4096  # nodes fed between drops of old history (history=False)
CHECK_EVERY = 4096  # nodes with accesses queued before the shadow memory checks them
# nodes fed before a run's checks move to the compiled pass (checks="auto"): loading it costs
# a process about 0.6 CPU s, what checking some 100,000 accesses one at a time costs
COMPILED_FROM = 65536
CHECKS = ("auto", "compiled", "per_access")  # HBDetector(checks=...)
DEFAULT_CHECKS = "auto"  # what HBDetector() uses; tests set it to run each shadow memory


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
    since a record or wait node is not followed by a sync.

    ``checks`` picks the shadow memory: ``"auto"`` (the default, :data:`DEFAULT_CHECKS`)
    checks a short run one access at a time (:mod:`model.shadow_per_access`) and moves a run
    that grows long to the compiled pass of :mod:`model.shadow` (:meth:`_shadow_memory`);
    ``"compiled"`` and ``"per_access"`` force one. The races are the same either way."""

    def __init__(self, history: bool = True, shadow: bool = True,
                 checks: str | None = None) -> None:
        # history=False: the opt-in mode for long runs (see the class docstring)
        self.history = history
        self.shadow = shadow  # False: no element-level checks (see the class docstring)
        checks = DEFAULT_CHECKS if checks is None else checks
        if checks not in CHECKS:
            raise DeviceUsageError(f"checks: expected one of {', '.join(CHECKS)}, got {checks!r}")
        self.checks = checks
        self.agent_names: list[str] = [HOST]
        # which agents are host threads (agent 0, the host, and those of add_host), and the
        # host whose issue order the nodes fed next follow (set by a multi-threaded feeder)
        self._is_host: list[bool] = [True]
        self.issuer = HOST_AGENT
        self._issued_by: dict[int, int] = {}  # stream node -> its issuing host, if not agent 0
        # per agent, its current clock over the agents registered so far (grown by add_agent)
        self._vc: list[list[int]] = [[0]]
        self._host_version = 0
        self._joined_host: list[int] = [0]
        self._last: list[OpId | None] = [None]
        self._events: dict[object, tuple[tuple[int, ...], OpId]] = {}
        # the shadow memory, chosen at the first check (:meth:`_shadow_memory`)
        self._shadow: ShadowMemory | PerAccessShadow | None = None
        self._shapes: dict[int, tuple[int, ...]] = {}  # each block's shape, by storage
        self._numels: dict[int, int] = {}
        self._queued: list[int] = []  # nodes with accesses not yet checked, in issue order
        self.nodes = NodeTable()
        self.node_accesses = NodeAccesses()  # per node, as declared
        self._node_rows = self.nodes._rows  # the tables' lists, appended to per node
        self._access_rows = self.node_accesses._rows
        # over the agents registered at the time (None: dropped, history=False)
        self.node_vc: list[tuple[int, ...] | None] = []
        self.node_epoch = array("q")  # each node's epoch (its agent's clock entry)
        self.node_agent = array("b")  # each node's agent
        # the program edges of joins (host syncs, bound waits), in order; :attr:`edges`
        # adds program and issue order to them when read (and keeps the list it built)
        self._join_edges: list[tuple[int, int]] = []
        self._edges: list[tuple[int, int]] = []
        self._edges_through = 0  # nodes the kept edge list covers
        self.observation_edges: list[tuple[int, int]] = []  # what the host observed
        # racing pairs found and not yet read, as the shadow memory's arrays;
        # :attr:`races` builds their Race records when read
        self._found: list[RacingPairs | RaceRows] = []
        self._races: list[Race] = []
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
        for clock in self._vc:
            clock.append(0)
        self._vc.append([0] * len(self.agent_names))
        self._joined_host.append(-1)
        self._last.append(None)
        self._live.append(deque())
        self._is_host.append(False)
        return len(self.agent_names) - 1

    def add_host(self, name: str) -> int:
        """Register a host thread of its own (STREAM-SEMANTICS.md "host threads"): an agent
        with its own program order whose issue order orders the stream nodes fed while it is
        :attr:`issuer`. Threads are ordered to each other only by the joins they are fed."""
        agent = self.add_agent(name)
        self._is_host[agent] = True
        return agent

    def is_host(self, agent: int) -> bool:
        """True for the host and every host thread of :meth:`add_host`."""
        return self._is_host[agent]

    def add_storage(self, storage: int, numel: int, shape: tuple[int, ...]) -> None:
        """Register a memory block before its first access."""
        if self.shadow:
            self._shapes[storage] = shape
            self._numels[storage] = numel
            if self._shadow is not None:
                self._shadow.add_storage(storage, numel)

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
        stops tracking, instead of a record per op and per access. Program order and host
        issue order are kept as the nodes' agents, not as edge tuples (:attr:`edges` builds
        them when read); only the explicit joins are logged."""
        op = row[0]
        a = row[2]
        vc = self._vc[a]
        host = self.issuer
        if not self._is_host[a]:
            stamp = self._host_version * MAX_AGENTS + host  # the issuer's past, as of now
            if self._joined_host[a] != stamp:
                _join(vc, self._vc[host])
                self._joined_host[a] = stamp
            if host != HOST_AGENT:
                self._issued_by[op] = host
        if joins or observed:
            self._join_all(op, vc, joins, observed)
        epoch = vc[a] + 1
        vc[a] = epoch
        node_epoch = self.node_epoch
        if op != len(node_epoch):
            raise DeviceUsageError(f"node ids must be dense and in issue order, got {op}")
        self._last[a] = op
        self._node_rows.append(row)
        self._access_rows.append(accesses)
        self.node_vc.append(tuple(vc))  # over the agents registered now; later ones read as 0
        node_epoch.append(epoch)
        self.node_agent.append(a)
        if self._is_host[a]:
            self._host_version += 1
        if accesses and self.shadow:
            queued = self._queued
            queued.append(op)
            if len(queued) >= CHECK_EVERY:
                self.check_queued()
        if not self.history:
            self._live[a].append(op)
            self._fed_since_drop += 1
            if self._fed_since_drop >= DROP_HISTORY_EVERY:
                self._drop_history(len(self.agent_names))

    def _join_all(self, op: int, vc: list[int], joins: Sequence[OpId],
                  observed: Sequence[OpId]) -> None:
        """Join the clocks of ``joins`` (program edges) and ``observed`` (observations) into
        ``vc``, the clock of node ``op``'s agent, and log the edges (with history)."""
        node_vc = self.node_vc
        history = self.history
        for sources, log in ((joins, self._join_edges), (observed, self.observation_edges)):
            for j in sources:
                joined = node_vc[j]
                if joined is not None:  # None: dropped, every agent knows it (_drop_history)
                    _join(vc, joined)
                if history:
                    log.append((j, op))

    @property
    def edges(self) -> list[tuple[int, int]]:
        """The program edges, in the order the nodes were fed: per node, the edge from the
        host's latest node before it (for a stream's node), those of its joins, and the one
        from its agent's previous node (program order). Built from the nodes' agents and
        the logged joins when read, and kept until more nodes are fed; empty without
        history."""
        if not self.history:
            return []
        built = self._edges
        if self._edges_through == len(self.node_agent):
            return built
        built.clear()
        joins = self._join_edges
        at = 0
        last: list[int | None] = [None] * len(self.agent_names)
        issued_by = self._issued_by
        for op, agent in enumerate(self.node_agent):
            host_last = last[issued_by.get(op, HOST_AGENT)]
            if not self._is_host[agent] and host_last is not None:
                built.append((host_last, op))
            while at < len(joins) and joins[at][1] == op:
                built.append(joins[at])
                at += 1
            previous = last[agent]
            if previous is not None:
                built.append((previous, op))
            last[agent] = op
        self._edges_through = len(self.node_agent)
        return built

    def _drop_history(self, n_agents: int) -> None:
        """history=False: drop the row, accesses and clock of every node that every agent's
        clock has passed. Such a node happens before every node still to come (a stream that
        has not run yet joins the host's clock first), so it can never race again, and
        joining its clock changes nothing (any clock that knows it knows all it knew)."""
        self._fed_since_drop = 0
        self.check_queued()  # the checks read the accesses, and races the rows, of these
        rows, accesses, clocks = self.nodes._rows, self.node_accesses._rows, self.node_vc
        node_epoch = self.node_epoch
        for agent, floor in enumerate(self._floor(n_agents)):
            live = self._live[agent]
            while live and node_epoch[live[0]] <= floor:
                op = live.popleft()
                rows[op] = accesses[op] = clocks[op] = None

    def _floor(self, n_agents: int) -> list[int]:
        """Per agent, the least entry any agent's clock has of it: nodes (and accesses) of
        that agent at or below it happen before every node still to come. Over the host and
        the streams that ran (one that has not run yet joins the host's clock first)."""
        vcs = [self._vc[x] for x in range(n_agents)
               if self._is_host[x] or self._joined_host[x] != -1]
        return [min(vc[agent] for vc in vcs) for agent in range(n_agents)]

    def check_queued(self) -> None:
        """Check the queued accesses against the shadow memory (:mod:`model.shadow`) and
        keep the racing pairs found. Called when the queue is long, before old history is
        dropped, and when :attr:`races` is read."""
        queued = self._queued
        if not queued:
            return
        n_agents = len(self.agent_names)
        batches = self._shadow_memory().check(
            queued, self._access_rows, self.node_vc, self.node_epoch, self.node_agent,
            n_agents, self._floor(n_agents))
        self._queued = []
        self._found += batches
        if not self.history:  # the rows a race record needs outlive the history
            kept, rows, accesses = self._kept, self._node_rows, self._access_rows
            for found in batches:
                for node in found.named_nodes():
                    if node not in kept:
                        kept[node] = (rows[node], accesses[node])

    def _shadow_memory(self) -> ShadowMemory | PerAccessShadow:
        """The run's shadow memory. With ``checks="auto"``: the compiled pass once the run
        is long (:data:`COMPILED_FROM` nodes fed, or history off) or once this process has
        loaded it, when numba is installed; the per-access checks before that
        (:mod:`model.shadow_per_access` says why). A run that grows long moves over: its
        accesses checked so far are replayed into the compiled pass's state (history keeps
        them), and the pairs the replay finds again are dropped. ``checks`` other than
        ``"auto"`` forces one. Both find the same pairs in the same order."""
        compiled = self._wants_compiled()
        if self._shadow is None:
            self._shadow = self._registered(ShadowMemory() if compiled else PerAccessShadow())
        elif compiled and isinstance(self._shadow, PerAccessShadow) and self.history:
            self._shadow = self._replayed()
        return self._shadow

    def _registered(self, shadow: ShadowMemory | PerAccessShadow
                    ) -> ShadowMemory | PerAccessShadow:
        """``shadow`` with every block registered so far added to it."""
        for storage, numel in self._numels.items():
            shadow.add_storage(storage, numel)
        return shadow

    def _wants_compiled(self) -> bool:
        if self.checks != "auto":
            return self.checks == "compiled"
        long_run = len(self.node_epoch) >= COMPILED_FROM or not self.history
        return (long_run or compiled_loaded()) and compiled_available()

    def _replayed(self) -> ShadowMemory:
        """A compiled shadow memory holding the state of every access checked so far (the
        nodes with accesses before the queue), its pairs dropped: they were found already."""
        shadow = self._registered(ShadowMemory())
        rows = self._access_rows
        checked = [op for op in range(self._queued[0]) if rows[op]]
        n_agents = len(self.agent_names)
        if checked:
            shadow.check(checked, rows, self.node_vc, self.node_epoch, self.node_agent,
                         n_agents, [0] * n_agents)
        shadow.older_scan_truncated = self._shadow.older_scan_truncated
        return shadow

    @property
    def older_scan_truncated(self) -> int:
        """Walks over an agent's older accesses of an element cut at
        :data:`model.shadow.MAX_OLDER_SCAN` entries (their older pairs are missing)."""
        self.check_queued()
        return 0 if self._shadow is None else self._shadow.older_scan_truncated

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
        """True when ``op`` happens before everything the host (:attr:`issuer`) issues from
        now on (the allocator's reuse test, by program edges: :mod:`model.allocator`)."""
        row = self.nodes._rows[op]
        if row is None:  # dropped (history=False): every agent, the host too, knows it
            return True
        return self._vc[self.issuer][row[2]] >= self.node_epoch[op]

    def event_op(self, key: object) -> OpId | None:
        """The record node an event currently captures, or None if never recorded."""
        rec = self._events.get(key)
        return None if rec is None else rec[1]

    # -- queries --------------------------------------------------------------------------
    @property
    def races(self) -> list[Race]:
        """Every racing pair found so far, in the order found (records built when read)."""
        self.check_queued()
        built = self._races
        if self._found:
            infos: dict = {}  # one record per node (and per node access) while building
            with collector_paused():
                for found in self._found:
                    built.extend([self._race(infos, *row) for row in found.rows()])
            self._found.clear()  # built: the pairs are not kept twice
        return built

    @property
    def race_count(self) -> int:
        """How many racing pairs have been found so far, every queued access checked; the
        records are not built (:attr:`races` builds them)."""
        self.check_queued()
        return len(self._races) + sum([len(found) for found in self._found])

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
        elif (pinned and (self._is_host[p.agent] or self._is_host[q.agent])
              and OpKind.COPY in (p.kind, q.kind)):
            kind = RaceKind.HOST_D2H
        elif prior_write:
            kind = RaceKind.WAW if write else RaceKind.RAW
        else:
            kind = RaceKind.WAR
        p_mode = "write" if prior_write else "read"
        q_mode = "write" if write else "read"
        manifest = _inverted(p, p_mode, q, q_mode)
        shape = self._shapes[storage]
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


def _join(vc: list[int], other: Sequence[int]) -> None:
    """``vc = max(vc, other)`` in place. ``vc`` is an agent's current clock, over every agent
    registered; a node's clock is kept only over the agents that existed when it ran
    (``other`` may be shorter: the rest are 0, no op had run on them)."""
    for x in range(min(len(vc), len(other))):
        if other[x] > vc[x]:
            vc[x] = other[x]


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
