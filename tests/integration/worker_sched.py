"""The suite's pytest-xdist scheduler (docs/testbed.md, "Running in parallel").

Each worker has clusters of its own (session fixtures) and modules share a kmirrord or a mirror
(module fixtures), so the unit of work is a module: all its tests run on one worker, in order.
Modules go out longest first (module_times.json, measured; a module not in it counts as 10 s a
test), each to whichever worker asks next, which balances the workers to within about one module.

A module in LAST_PER_WORKER (the leak scan, which checks everything that worker's proxies sent
to their clients) is parametrized by worker id (`per_worker` fixture); its test for worker gwN is
sent to gwN alone, after all the other modules have been handed out, so it runs last there."""

import json
import os
import re

from xdist.workermanage import parse_tx_spec_config

HERE = os.path.dirname(os.path.abspath(__file__))
TIMES = os.path.join(HERE, "module_times.json")
LAST_PER_WORKER = ("test_proxy_zz_leaks.py",)
_WORKER_PARAM = re.compile(r"\[(gw\d+)\]$")


def module_of(nodeid):
    return nodeid.split("::", 1)[0]


def last_worker_of(nodeid):
    """The worker a per-worker test belongs to, or None for an ordinary test."""
    if os.path.basename(module_of(nodeid)) not in LAST_PER_WORKER:
        return None
    m = _WORKER_PARAM.search(nodeid)
    return m.group(1) if m else None


def load_times(release):
    """{module file: seconds} measured for the Kafka release (or the closest entry)."""
    try:
        with open(TIMES) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data.get(release) or data.get("default") or {}


class ModuleScheduling:
    """Implements xdist's Scheduling protocol (xdist/scheduler/protocol.py)."""

    def __init__(self, config, log=None):
        self.numnodes = len(parse_tx_spec_config(config))
        self.config = config
        self.log = log
        self.collection = None
        self.registered = {}   # node -> its collection (list of nodeids)
        self.assigned = {}     # node -> {nodeid: completed}
        self.queue = []        # units (lists of nodeids) not handed out yet, first out first
        self.last = {}         # worker id -> its per-worker unit
        self.last_sent = set()

    # -- the protocol's properties --------------------------------------------------------------

    @property
    def nodes(self):
        return list(self.assigned)

    @property
    def collection_is_completed(self):
        return len(self.registered) >= self.numnodes

    @property
    def tests_finished(self):
        if not self.collection_is_completed or self.collection is None or self.queue:
            return False
        if any(w not in self.last_sent for w in self._live_worker_ids()):
            return False
        return all(self._pending(n) < 2 for n in self.assigned)

    @property
    def has_pending(self):
        return bool(self.queue) or any(self._pending(n) for n in self.assigned)

    # -- nodes ----------------------------------------------------------------------------------

    def add_node(self, node):
        self.assigned[node] = {}

    def add_node_collection(self, node, collection):
        if self.collection is not None and list(collection) != self.collection:
            return  # a late node that collected something else gets nothing
        self.registered[node] = list(collection)

    def remove_node(self, node):
        work = self.assigned.pop(node)
        undone = [nid for nid, done in work.items() if not done]
        if not undone:
            return None
        # A crashed worker: its ordinary tests go back to the queue (the crashed one is reported
        # by xdist); its per-worker tests die with it.
        again = [nid for nid in undone[1:] if last_worker_of(nid) is None]
        if again:
            self.queue.insert(0, again)
        for n in self.assigned:
            self._reschedule(n)
        return undone[0]

    def _live_worker_ids(self):
        return {n.gateway.id for n in self.assigned if n.gateway.id in self.last}

    # -- tests ----------------------------------------------------------------------------------

    def mark_test_complete(self, node, item_index, duration=0):
        self.assigned[node][self.registered[node][item_index]] = True
        self._reschedule(node)

    def mark_test_pending(self, item):
        raise NotImplementedError()

    def remove_pending_tests_from_node(self, node, indices):
        raise NotImplementedError()

    def _pending(self, node):
        return sum(1 for done in self.assigned.get(node, {}).values() if not done)

    def _send(self, node, nodeids):
        col = self.registered[node]
        for nid in nodeids:
            self.assigned[node][nid] = False
        node.send_runtest_some([col.index(nid) for nid in nodeids])

    def _reschedule(self, node):
        if node.shutting_down or node not in self.assigned:
            return
        if self.queue:
            # A few tests ahead keep a worker busy (it runs an item only once it holds the next
            # one, or was told to shut down); a module is sent whole.
            while self.queue and self._pending(node) <= 2:
                self._send(node, self.queue.pop(0))
            if self.queue:
                return
        wid = node.gateway.id
        if wid in self.last and wid not in self.last_sent:
            self.last_sent.add(wid)
            self._send(node, self.last[wid])
        node.shutdown()

    def schedule(self):
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self._reschedule(node)
            return
        cols = list(self.registered.values())
        if any(c != cols[0] for c in cols[1:]):
            if self.log:
                self.log("**Different tests collected, aborting run**")
            return
        self.collection = cols[0]
        release = os.environ.get("KM_KAFKA_VERSION", "")
        times = load_times(release)
        units = {}
        for nid in self.collection:
            wid = last_worker_of(nid)
            if wid is not None:
                self.last.setdefault(wid, []).append(nid)
            else:
                units.setdefault(module_of(nid), []).append(nid)

        def weight(mod):
            t = times.get(os.path.basename(mod))
            return t if t is not None else 10.0 * len(units[mod])
        self.queue = [units[m] for m in sorted(units, key=lambda m: -weight(m))]
        for node in self.nodes:
            self._reschedule(node)


def pytest_xdist_make_scheduler(config, log):
    """Ours for xdist's default distribution (`-n N`); another --dist keeps xdist's own."""
    if config.getvalue("dist") == "load":
        return ModuleScheduling(config, log)
    return None
