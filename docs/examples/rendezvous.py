"""A rendezvous across the nodes of one booking, with plain sockets (what torchrun's c10d does).

Rank 0 (NODE_RANK=0) listens on MASTER_ADDR:MASTER_PORT; every other rank connects and says its
rank; once all GPU_PORTAL_NNODES ranks are in, rank 0 answers each with the world it saw and all
ranks print it and exit 0. Run it as a multi-node booking's command:

    gpu-portal submit --nodes 2 --any-model -t 10m -- python3 /path/to/rendezvous.py
"""

import os
import socket
import sys
import time

TIMEOUT_S = float(os.environ.get("RENDEZVOUS_TIMEOUT_S", "60"))


def main() -> int:
    rank = int(os.environ["NODE_RANK"])
    nnodes = int(os.environ["GPU_PORTAL_NNODES"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    world = os.environ["WORLD_SIZE"]
    if rank == 0:
        seen = serve(addr, port, nnodes)
    else:
        seen = join(addr, port, rank)
    print(f"rank {rank} of {nnodes} nodes ({world} GPUs) met ranks {seen}", flush=True)
    return 0


def serve(addr: str, port: int, nnodes: int) -> str:
    with socket.create_server((addr, port), reuse_port=False) as server:
        server.settimeout(TIMEOUT_S)
        peers = []
        while len(peers) < nnodes - 1:
            conn, _ = server.accept()
            peers.append((conn, conn.makefile("r").readline().strip()))
        seen = ",".join(sorted(["0", *(rank for _, rank in peers)], key=int))
        for conn, _ in peers:
            conn.sendall(f"{seen}\n".encode())
            conn.close()
        return seen


def join(addr: str, port: int, rank: int) -> str:
    deadline = time.monotonic() + TIMEOUT_S
    while True:  # rank 0 may not listen yet: every node starts at once, none waits for another
        try:
            conn = socket.create_connection((addr, port), timeout=TIMEOUT_S)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with conn:
        conn.sendall(f"{rank}\n".encode())
        return conn.makefile("r").readline().strip()


if __name__ == "__main__":
    sys.exit(main())
