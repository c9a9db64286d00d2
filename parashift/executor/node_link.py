"""Node 0's side of the control channel to the other hosts' ranks, over TCP.

Every other host runs a node agent (`node_agent.py`) that starts its ranks. Each remote
rank opens its own connection to node 0 and is then driven exactly as a local rank is
over its pipe: `multiprocessing.connection` gives both the same `send_bytes`/`recv_bytes`
and `wait()` interface, so the executor sends the same binary step messages to either.
Each agent keeps one more connection, on which it reports its ranks' heartbeats and exit
codes every HEARTBEAT_INTERVAL_S; a `RemoteRank` stands for a remote rank's process
(its exit code, a sentinel to wait on, kill). A host whose agent connection closes, or
is silent for NODE_SILENCE_S, is lost: each of its ranks ends as a dead rank does."""
import logging
import os
import socket
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge

logger = logging.getLogger(__name__)

NODE_SILENCE_S = 1.5  # a host silent this long is lost (agents report every 0.2 s)
NODE_LOST = -1000  # a RemoteRank's exit code once its host is lost


def cluster_authkey() -> bytes:
    """What both ends prove they share before any pickle is read (a check against stray
    connections, not a security boundary: keep the port on a private network)."""
    return os.environ.get("PARASHIFT_CLUSTER_KEY", "parashift-cluster").encode()


def no_delay(conn: Connection) -> Connection:
    """Sends small messages at once (no Nagle wait for an ACK): a step is latency-bound."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.close()
    return conn


class RemoteRank:
    """A rank's process on another host, as the executor watches a local one (the names
    of multiprocessing.Process it uses)."""

    def __init__(self, rank: int, node: int, link: "NodeLink", generation: int = 0):
        self.rank, self.node, self.link, self.generation = rank, node, link, generation
        self.pid = None  # not a local process: never read as stopped from /proc
        self.exitcode: int | None = None
        self.lost_reason = ""
        self._ended = threading.Event()
        self._read_fd, self._write_fd = os.pipe()  # closed when it ends: wakes wait()

    @property
    def sentinel(self) -> int:
        return self._read_fd

    def end(self, exitcode: int, reason: str = "") -> None:
        if self._ended.is_set():
            return
        self.exitcode, self.lost_reason = exitcode, reason
        self._ended.set()
        os.close(self._write_fd)

    def is_alive(self) -> bool:
        return not self._ended.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._ended.wait(timeout)

    def kill(self) -> None:
        self.link.send(("kill", self.rank))


class NodeLink:
    """One other host's agent connection: a thread reads its reports into `heartbeats`
    (this process's clock) and ends its ranks when the host is lost."""

    def __init__(self, node: int, conn: Connection, ranks: range, heartbeats):
        self.node, self.conn, self.heartbeats = node, conn, heartbeats
        self.ranks = {rank: RemoteRank(rank, node, self) for rank in ranks}
        self._send_lock = threading.Lock()
        self._closing = False  # a shutdown, not a loss
        self._thread = threading.Thread(target=self._read_reports, daemon=True,
                                        name=f"parashift-node-{node}")

    def start(self) -> None:
        self._thread.start()

    def send(self, message) -> None:
        try:
            with self._send_lock:
                self.conn.send(message)
        except OSError:  # the host is gone: the reader thread says so
            pass

    def _read_reports(self) -> None:
        while True:
            try:
                if not self.conn.poll(NODE_SILENCE_S):
                    return self._lose(f"node {self.node} lost: no report for "
                                      f"{NODE_SILENCE_S:g} s")
                kind, report = self.conn.recv()
            except (EOFError, OSError):
                return self._lose(f"node {self.node} lost: its control connection closed")
            if kind == "beat":
                self._take_beat(report)

    def _take_beat(self, report: dict) -> None:
        """{rank: (exit code or None, seconds since its last heartbeat, its generation)};
        a replaced process's last reports are not its replacement's."""
        now = time.monotonic()
        for rank, (exitcode, age, generation) in report.items():
            if generation != self.ranks[rank].generation:
                continue
            if exitcode is not None:
                self.ranks[rank].end(exitcode)
            elif age is not None:
                self.heartbeats[rank] = now - age

    def _lose(self, reason: str) -> None:
        if not self._closing:
            logger.error("%s: its ranks %s are lost", reason, list(self.ranks))
        for remote in self.ranks.values():
            remote.end(NODE_LOST, reason)
        self.conn.close()

    def start_ranks(self, spec, ranks) -> list[RemoteRank]:
        """Replacement processes for `ranks` of this host (its agent starts them at the
        spec's generation); each connects to node 0 as at start-up (`Rejoins`)."""
        for rank in ranks:
            self.ranks[rank] = RemoteRank(rank, self.node, self, spec.generation)
        self.send(("start", (spec, list(ranks))))
        return [self.ranks[rank] for rank in ranks]

    @property
    def lost(self) -> bool:
        return not self._thread.is_alive() and self._thread.ident is not None

    def shutdown(self, grace_s: float) -> None:
        self._closing = True
        self.send(("shutdown", grace_s))
        self._thread.join(grace_s + NODE_SILENCE_S)


def accept_nodes(address: tuple[str, int], spec, topology, heartbeats,
                 timeout_s: float) -> tuple[list[NodeLink], dict[int, Connection]]:
    """Waits for every other host's agent and each of its ranks; sends each agent the
    workers' spec. Returns the links and each remote rank's step connection."""
    nodes = {node: topology.ranks_of(node) for node in range(1, topology.nnodes)}
    remote = {r for ranks in nodes.values() for r in ranks}
    links, conns = accept_ranks(address, remote, timeout_s, nodes, spec, heartbeats)
    return [links[node] for node in sorted(links)], conns


def accept_ranks(address: tuple[str, int], ranks: set[int], timeout_s: float,
                 nodes: dict[int, range] | None = None, spec=None, heartbeats=None):
    """Accepts a step connection from each of `ranks` and, for each host of `nodes`
    (node -> its ranks), its agent's connection (a NodeLink, sent `spec`)."""
    links, conns, nodes = {}, {}, nodes or {}
    deadline = time.monotonic() + timeout_s
    with socket.create_server(address) as server:
        server.settimeout(HANDSHAKE_POLL_S)
        while set(links) != set(nodes) or set(conns) != ranks:
            if time.monotonic() > deadline:
                raise TimeoutError(_missing(address, timeout_s, set(nodes) - set(links),
                                            ranks - set(conns)))
            conn = _accept(server)
            if conn is None:
                continue
            if not conn.poll(HELLO_TIMEOUT_S):  # authenticated but silent
                conn.close()
                continue
            kind, index = conn.recv()
            if kind == "agent" and index in nodes and index not in links:
                links[index] = NodeLink(index, conn, nodes[index], heartbeats)
                conn.send(spec)
            elif kind == "rank" and index in ranks and index not in conns:
                conns[index] = conn
            else:
                conn.close()
                logger.warning("refused a control connection from %r %r", kind, index)
    for link in links.values():
        link.start()
    return links, conns


class Rejoins:
    """After start-up, node 0's control port stays open (a thread): a host that comes back
    (its agent) and the replacement ranks that any agent starts connect here; the
    executor takes them (`take_agent`, `take_rank`)."""

    def __init__(self, address: tuple[str, int]):
        self.agents: dict[int, Connection] = {}
        self.ranks: dict[int, Connection] = {}
        self._lock, self._closed = threading.Lock(), False
        self._server = socket.create_server(address)
        self._server.settimeout(HANDSHAKE_POLL_S)
        threading.Thread(target=self._accept_all, daemon=True, name="parashift-rejoins").start()

    def _accept_all(self) -> None:
        while not self._closed:
            try:
                conn = _accept(self._server)
            except OSError:  # closed
                return
            if conn is None:
                continue
            if not conn.poll(HELLO_TIMEOUT_S):
                conn.close()
                continue
            kind, index = conn.recv()
            with self._lock:
                found = self.agents if kind == "agent" else self.ranks if kind == "rank" else None
                if found is None:
                    conn.close()
                    continue
                if index in found:
                    found[index].close()  # an older one that was never taken
                found[index] = conn
            logger.warning("control connection from %s %s", kind, index)

    def take_agent(self, node: int) -> Connection | None:
        with self._lock:
            return self.agents.pop(node, None)

    def take_rank(self, rank: int) -> Connection | None:
        with self._lock:
            return self.ranks.pop(rank, None)

    def close(self) -> None:
        self._closed = True
        self._server.close()


HANDSHAKE_POLL_S = 0.5
HELLO_TIMEOUT_S = 5.0


def _accept(server: socket.socket) -> Connection | None:
    """The next connection that proves it holds the cluster key; None after a poll."""
    try:
        sock, _ = server.accept()
    except (socket.timeout, TimeoutError):
        return None
    sock.setblocking(True)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = Connection(sock.detach())
    try:
        deliver_challenge(conn, cluster_authkey())
        answer_challenge(conn, cluster_authkey())
    except (AuthenticationError, EOFError, OSError) as e:
        logger.warning("refused a control connection: %s", e)
        conn.close()
        return None
    return conn


def connect(address: tuple[str, int], hello: tuple[str, int], timeout_s: float = 60.0
            ) -> Connection:
    """A connection to node 0's control port, introduced as `hello`; retried until node 0
    listens (it may start after this host)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = no_delay(Client(address, authkey=cluster_authkey()))
            break
        except OSError:  # refused, reset: not listening yet
            if time.monotonic() > deadline:
                raise TimeoutError(f"node 0's control port {address[0]}:{address[1]} did "
                                   f"not answer within {timeout_s:.0f} s") from None
            time.sleep(0.2)
    conn.send(hello)
    return conn


def _missing(address, timeout_s: float, nodes: set[int], ranks: set[int]) -> str:
    return (f"within {timeout_s:.0f} s on port {address[1]}: no agent of node(s) "
            f"{sorted(nodes)} / no control connection of rank(s) {sorted(ranks)}; start "
            "`parashift serve ... --nnodes N --node-rank i` on every other host")
