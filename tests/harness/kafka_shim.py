"""A relay in front of one broker listener that answers chosen requests itself, or holds the broker's
answers to them: for a fault a real broker does not give on demand for one client only (its group
coordinator refusing one member's heartbeats while another member's go through; one client's
Fetch answers late while the others' are not). Every other request is passed to the broker as it
is, and each connection's answers go back in request order, as a broker's do.

    shim = KafkaShim(target_port).start()       # listens on shim.port
    shim.answer(68, not_coordinator_heartbeat)  # ConsumerGroupHeartbeat answered here from now on
    shim.answer(68, None)                       # passed on again
    shim.delay(1, 0.6)                          # the broker's Fetch answers held 0.6 s each
    shim.stop()
"""

import asyncio
import collections
import struct
import threading

from .kafka_cluster import KafkaCluster, free_port


def not_coordinator_heartbeat(version, corr):
    """A ConsumerGroupHeartbeat answer (v0/v1, flexible) with NOT_COORDINATOR (16), framed."""
    body = struct.pack(">i", corr) + b"\x00"                  # response header v1: no tagged fields
    body += struct.pack(">ih", 0, 16) + b"\x00" + b"\x00"      # throttle, error, message null, member id null
    body += struct.pack(">ii", 0, 5000) + b"\xff" + b"\x00"    # epoch, interval, assignment null, tags
    return struct.pack(">i", len(body)) + body


class KafkaShim:
    def __init__(self, target_port, host="127.0.0.1", port=None):
        self.target = (host, target_port)
        self.host = host
        self.port = port or free_port()
        self.rules = {}          # api key -> fn(version, corr) -> a framed answer
        self.delays = {}         # api key -> seconds the broker's answer is held
        self.answered = collections.Counter()
        self.held = collections.Counter()  # api key -> the broker's answers held (delay)
        self._loop = None
        self._server = None
        self._thread = None
        self._ready = threading.Event()

    def answer(self, api_key, fn):
        """From now on, requests of api_key are answered by fn (None: passed to the broker)."""
        if fn is None:
            self.rules.pop(api_key, None)
        else:
            self.rules[api_key] = fn

    def delay(self, api_key, seconds):
        """From now on, the broker's answers to requests of api_key reach the client seconds after
        they came (and the answers after them on that connection with them); 0: at once."""
        if seconds:
            self.delays[api_key] = seconds
        else:
            self.delays.pop(api_key, None)

    def start(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the shim did not start")
        return self

    def stop(self):
        if self._loop:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(10)

    def _run(self):
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._conn, self.host, self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _conn(self, cr, cw):
        try:
            sr, sw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.close()
            return
        order = collections.deque()  # [answer or None, passed on?, api key], in request order

        def flush():
            while order and order[0][0] is not None:
                cw.write(order.popleft()[0])

        async def up():
            while True:
                size = await cr.readexactly(4)
                body = await cr.readexactly(struct.unpack(">i", size)[0])
                key, ver, corr = struct.unpack(">hhi", body[:8])
                fn = self.rules.get(key)
                if fn:
                    self.answered[key] += 1
                    order.append([fn(ver, corr), False, key])
                    flush()
                else:
                    order.append([None, True, key])
                    sw.write(size + body)
                    await sw.drain()

        async def down():
            while True:
                size = await sr.readexactly(4)
                body = await sr.readexactly(struct.unpack(">i", size)[0])
                for e in order:
                    if e[1] and e[0] is None:
                        e[1] = False  # taken: the answer is in, or on its way
                        held = self.delays.get(e[2])
                        if held:
                            self.held[e[2]] += 1
                            asyncio.get_running_loop().call_later(held, fill, e, size + body)
                        else:
                            fill(e, size + body)
                        break

        def fill(e, answer):
            e[0] = answer
            flush()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            for w in (cw, sw):
                try:
                    w.close()
                except Exception:
                    pass


def shimmed_cluster(name, listener):
    """A one-broker KafkaCluster (not started) with an extra listener whose clients all go through
    a started KafkaShim: the listener is advertised at the shim's port. Returns (cluster, shim); a
    client bootstrapped at 127.0.0.1:<shim.port> reaches the broker only through it."""
    cluster = KafkaCluster(name, brokers=1, extra_listeners={listener: {}})
    (node,) = cluster.broker_nodes
    shim = KafkaShim(node.extra_ports[listener]).start()
    cluster.extra_listeners[listener] = {node.node_id: f"127.0.0.1:{shim.port}"}
    return cluster, shim
