"""The engine-hosted rendezvous store and the hosts a replacement needs
(executor/replacement.py); the processes themselves: tests/distributed/test_self_healing.py
and tests/distributed/test_multinode.py."""
import datetime
import socket

import pytest
import torch.distributed as dist

from parashift.executor.base import HostDown
from parashift.executor.replacement import Hosts, host_store
from parashift.parallel.topology import Topology


def test_the_store_outlives_its_clients():
    store = host_store("127.0.0.1", 0, timeout_s=5)
    client = dist.TCPStore("127.0.0.1", store.port, is_master=False,
                           timeout=datetime.timedelta(seconds=5))
    dist.PrefixStore("generation1", client).set("key", "value")
    del client  # a rank gone
    again = dist.TCPStore("127.0.0.1", store.port, is_master=False,
                          timeout=datetime.timedelta(seconds=5))
    assert dist.PrefixStore("generation1", again).get("key") == b"value"


class _Link:
    def __init__(self, node, lost):
        self.node, self.lost = node, lost


def test_a_lost_host_is_waited_for_until_its_agent_connects():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    hosts = Hosts([_Link(1, lost=True)], Topology.for_world(4, 2), None, ("127.0.0.1", port))
    try:
        hosts.check_up([0, 1])  # node 0's ranks: local
        with pytest.raises(HostDown, match="node 1 is lost"):
            hosts.check_up([2, 3])
        hosts.rejoins.agents[1] = object()  # its agent came back
        hosts.check_up([2, 3])
    finally:
        hosts.shutdown(0)
