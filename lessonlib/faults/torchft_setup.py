"""How the course starts torchft: a Lighthouse and replica managers on loopback only.

What it teaches: what a fault-tolerant job listens on. torchft (0.2.0) coordinates replica
groups through a Lighthouse (``lighthouse``: bound to 127.0.0.1 here; torchft's own tests
bind ``[::]``, every interface) and gives each group a ``Manager`` (``replica_manager``).
The Manager binds its ManagerServer to ``[::]`` with no option to change it, so each rank
swaps in one bound to 127.0.0.1 (``loopback_manager_server``); a recovering replica takes
the state over the replicas' gloo group (``PGTransport``) instead of torchft's default HTTP
server, which binds every interface. The one listener left on every interface is each
replica group's TCPStore, which torchft's process groups meet through: torch's TCPStore has
no bind address (``listening`` reports what a rank listens on, to check it).

Laptop:  ``python -c "from lessonlib.faults import replicas; print(replicas.run())"``
GPU box: the same (the replicas stay CPU ranks over gloo).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(seconds=15)   # quorums, collectives, recovery: generous on a loaded laptop


def loopback_manager_server(**kwargs):
    """torchft's ManagerServer, bound to 127.0.0.1 instead of every interface."""
    from torchft._torchft import ManagerServer
    return ManagerServer(**{**kwargs, "bind": kwargs["bind"].replace("[::]", "127.0.0.1")})


def listening() -> list[tuple[str, int]]:
    """(address, port) of every socket this process listens on."""
    import psutil
    return sorted((c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("inet")
                  if c.status == psutil.CONN_LISTEN)


@contextmanager
def lighthouse(min_replicas: int = 2):
    """A Lighthouse on 127.0.0.1 for the block: yields (its address for clients, its port).
    ``address()`` names the host, not the address it is bound to: clients get 127.0.0.1."""
    os.environ.setdefault("RUST_LOG", "warn")     # torchft's servers log every quorum at info
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=min_replicas, join_timeout_ms=500,
                              heartbeat_timeout_ms=2000)
    try:
        port = int(server.address().rsplit(":", 1)[1].strip("/"))
        yield f"http://127.0.0.1:{port}", port
    finally:
        server.shutdown()


def replica_manager(replica: int, address: str, load_state_dict, state_dict,
                    min_replicas: int = 2, init_sync: bool = True):
    """This rank as replica group ``replica`` of one rank: (its Manager, its TCPStore).
    Synchronous quorums (DiLoCo needs them; the lesson reads more plainly with them).
    ``init_sync``: the first quorum copies the first replica's state to the others (off
    where every replica starts from the same seed)."""
    import torchft.manager
    from torchft.checkpointing.pg_transport import PGTransport
    from torchft.process_group import ProcessGroupGloo

    torchft.manager.ManagerServer = loopback_manager_server
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pg = ProcessGroupGloo(timeout=TIMEOUT)
    manager = torchft.manager.Manager(
        pg=pg, min_replica_size=min_replicas, replica_id=f"replica{replica}", rank=0,
        world_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
        store_addr="127.0.0.1", store_port=store.port, lighthouse_addr=address,
        hostname="127.0.0.1", use_async_quorum=False, init_sync=init_sync, timeout=TIMEOUT,
        quorum_timeout=TIMEOUT, connect_timeout=TIMEOUT,
        checkpoint_transport=PGTransport(pg, timeout=TIMEOUT, device=torch.device("cpu")))
    return manager, store
