"""What a link between two hosts does: round trips and a bulk transfer over one TCP connection.

    python -I -S bench/hosts/probe.py serve ADDRESS PORT
    python -I -S bench/hosts/probe.py measure ADDRESS PORT ROUNDS MIB

``serve`` prints ``listening`` once it accepts, answers each 1-byte ping with one byte,
and after a transfer's ``MIB`` MiB have all arrived, one byte more; it serves one
client, then exits. ``measure`` prints one JSON line: ``rtt_us`` (every round trip of
``ROUNDS`` 1-byte pings, in microseconds, sorted) and ``seconds``, the time from the
first byte sent to the reply to the last (``MIB`` MiB, then a 1-byte round trip).
``Hosts.measure`` runs the pair in two hosts. Standard library only.
"""

from __future__ import annotations

import json
import socket
import sys
import time

CHUNK = 1 << 20


def serve(address: str, port: int) -> None:
    with socket.create_server((address, port)) as listener:
        print("listening", flush=True)
        conn, _ = listener.accept()
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        header = _exact(conn, 8)
        rounds, mib = int.from_bytes(header[:4], "big"), int.from_bytes(header[4:], "big")
        for _ in range(rounds):
            conn.sendall(_exact(conn, 1))
        left = mib * CHUNK
        while left:
            left -= len(conn.recv(min(left, CHUNK)))
        conn.sendall(b"d")


def measure(address: str, port: int, rounds: int, mib: int) -> dict:
    with socket.create_connection((address, port), timeout=60) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(rounds.to_bytes(4, "big") + mib.to_bytes(4, "big"))
        rtts = []
        for _ in range(rounds):
            start = time.perf_counter()
            conn.sendall(b"p")
            _exact(conn, 1)
            rtts.append((time.perf_counter() - start) * 1e6)
        block = bytes(CHUNK)
        start = time.perf_counter()
        for _ in range(mib):
            conn.sendall(block)
        _exact(conn, 1)
        seconds = time.perf_counter() - start
    return {"rtt_us": sorted(rtts), "mib": mib, "seconds": seconds}


def _exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"the peer closed the connection after {len(data)} of {n} bytes")
        data += chunk
    return data


def main() -> None:
    if sys.argv[1:2] == ["serve"] and len(sys.argv) == 4:
        serve(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1:2] == ["measure"] and len(sys.argv) == 6:
        print(json.dumps(measure(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))))
    else:
        sys.exit(f"usage: {sys.argv[0]} serve ADDRESS PORT | measure ADDRESS PORT ROUNDS MIB")


if __name__ == "__main__":
    main()
