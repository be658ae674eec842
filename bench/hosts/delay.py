"""A link's latency without ``netem``: hold every packet a host sends for the link's delay.

    python -I -S bench/hosts/delay.py IFNAME DELAY_US [QUEUE]

Run inside a host's network namespace (``ip netns exec``), as root. It binds netfilter
queue ``QUEUE`` (``nfnetlink_queue``; each namespace has its own queues), then adds one
nf_tables rule to the namespace: ``table ip shmpad-link { chain out { type filter hook
postrouting priority 0; meta oif IFNAME NFQUEUE --queue-num QUEUE } }``,
its verdict the xtables ``NFQUEUE`` target through ``nft_compat`` (what iptables-nft's
``-j NFQUEUE`` sends; a kernel may lack nft's own ``queue`` expression, as the one this
was written on does). No ``bypass``: with no process bound to the queue the link drops
everything, so a dead delayer is a dead link, never a fast one.
The kernel then parks every IPv4 packet leaving through ``IFNAME`` in the queue and
sends this process its id (metadata only: the payload stays in the kernel, and with
``NFQA_CFG_F_GSO`` it does not cut a GSO packet into segments to queue it). ``DELAY_US``
microseconds after a packet arrived, one ``NFQNL_MSG_VERDICT_BATCH`` accepts it and
every packet queued before it, in order, and the packet goes on to the link's qdisc
(the token bucket that limits its rate). It prints ``ready`` once the rule is in place.

Why not ``tc qdisc ... netem delay``: a kernel built without ``CONFIG_NET_SCH_NETEM``
has no netem (tc says "Specified qdisc kind is unknown"), and without ``fq`` no qdisc
honours a packet's departure time either; netfilter queues are in most kernels (built
in on that one). The cost: a packet is late by at least ``DELAY_US``, and by as much more as
this process is late to wake (its timer slack is set to 1 ns; on a busy core, a
scheduling delay is added). ``Hosts.measure`` (``bench/hosts/netns.py``) measures the
round trip a link gives, and ``python -m bench.hosts`` prints it before every run.

Standard library only (it starts under ``python -I -S`` in a few milliseconds), no
import of shmpad. Ends on SIGTERM or SIGINT; the rule ends with its namespace.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE, NLM_F_APPEND = 0x1, 0x4, 0x200, 0x400, 0x800
NLMSG_ERROR = 2
NLA_F_NESTED = 0x8000
NFNL_SUBSYS_QUEUE, NFNL_SUBSYS_NFTABLES = 3, 10
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 0x10, 0x11
NFPROTO_IPV4 = 2
NF_ACCEPT = 1
NF_INET_POST_ROUTING = 4

# linux/netfilter/nfnetlink_queue.h
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 2, 3
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 1 << 2

# linux/netfilter/nf_tables.h
NFT_MSG_NEWTABLE, NFT_MSG_DELTABLE, NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE = 0, 2, 3, 6
NFTA_TABLE_NAME = 1
NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME, NFTA_CHAIN_HOOK, NFTA_CHAIN_TYPE = 1, 3, 4, 7
NFTA_HOOK_HOOKNUM, NFTA_HOOK_PRIORITY = 1, 2
NFTA_RULE_TABLE, NFTA_RULE_CHAIN, NFTA_RULE_EXPRESSIONS = 1, 2, 4
NFTA_LIST_ELEM = 1
NFTA_EXPR_NAME, NFTA_EXPR_DATA = 1, 2
NFTA_META_DREG, NFTA_META_KEY = 1, 2
NFT_META_OIF = 5
NFTA_CMP_SREG, NFTA_CMP_OP, NFTA_CMP_DATA = 1, 2, 3
NFT_CMP_EQ = 0
NFTA_DATA_VALUE = 1
NFT_REG_1 = 1
# linux/netfilter/nf_tables_compat.h, xt_NFQUEUE.h: the xtables target iptables-nft's ``-j NFQUEUE`` uses
NFTA_TARGET_NAME, NFTA_TARGET_REV, NFTA_TARGET_INFO = 1, 2, 3
XT_NFQUEUE_REV = 1  # struct xt_NFQ_info_v1 { u16 queuenum; u16 queues_total; }, padded to XT_ALIGN (8)

TABLE, CHAIN = "shmpad-link", "out"
QUEUE_MAXLEN = 65536  # packets held at once; at 64 KiB each, far above any link's delay x rate here
RCVBUF = 64 << 20  # one message per packet: room for the queue's worth of them


def attr(kind: int, data: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    return struct.pack("=HH", 4 + len(data), kind) + data + b"\0" * (-len(data) % 4)


def nest(kind: int, *attrs: bytes) -> bytes:
    return attr(kind | NLA_F_NESTED, b"".join(attrs))


def strz(s: str) -> bytes:
    return s.encode() + b"\0"


def be32(v: int) -> bytes:
    return struct.pack(">I", v)


def message(kind: int, flags: int, seq: int, family: int, res_id: int, *attrs: bytes) -> bytes:
    """nlmsghdr, nfgenmsg (res_id big-endian), then the attributes."""
    body = struct.pack("=BBH", family, 0, socket.htons(res_id)) + b"".join(attrs)
    return struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body


def expr(name: str, *attrs: bytes) -> bytes:
    return nest(NFTA_LIST_ELEM, attr(NFTA_EXPR_NAME, strz(name)), nest(NFTA_EXPR_DATA, *attrs))


def rule_batch(ifindex: int, queue: int) -> tuple[bytes, set[int]]:
    """The nf_tables batch that makes the table, its chain and the queueing rule; and the
    sequence numbers whose acknowledgement says it was applied."""
    nft = NFNL_SUBSYS_NFTABLES << 8
    new = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK
    hook = nest(NFTA_CHAIN_HOOK, attr(NFTA_HOOK_HOOKNUM, be32(NF_INET_POST_ROUTING)), attr(NFTA_HOOK_PRIORITY, be32(0)))
    expressions = nest(
        NFTA_RULE_EXPRESSIONS,
        expr("meta", attr(NFTA_META_KEY, be32(NFT_META_OIF)), attr(NFTA_META_DREG, be32(NFT_REG_1))),
        expr(
            "cmp",
            attr(NFTA_CMP_SREG, be32(NFT_REG_1)),
            attr(NFTA_CMP_OP, be32(NFT_CMP_EQ)),
            nest(NFTA_CMP_DATA, attr(NFTA_DATA_VALUE, struct.pack("=I", ifindex))),  # meta oif: host order
        ),
        expr(
            "target",
            attr(NFTA_TARGET_NAME, strz("NFQUEUE")),
            attr(NFTA_TARGET_REV, be32(XT_NFQUEUE_REV)),
            attr(NFTA_TARGET_INFO, struct.pack("=HH4x", queue, 1)),
        ),
    )
    parts = [
        message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 1, socket.AF_UNSPEC, NFNL_SUBSYS_NFTABLES),
        # add, delete, add: the rule of an earlier delayer (one that was ended) goes in the same transaction
        message(nft | NFT_MSG_NEWTABLE, new, 2, NFPROTO_IPV4, 0, attr(NFTA_TABLE_NAME, strz(TABLE))),
        message(
            nft | NFT_MSG_DELTABLE, NLM_F_REQUEST | NLM_F_ACK, 3, NFPROTO_IPV4, 0, attr(NFTA_TABLE_NAME, strz(TABLE))
        ),
        message(nft | NFT_MSG_NEWTABLE, new | NLM_F_EXCL, 4, NFPROTO_IPV4, 0, attr(NFTA_TABLE_NAME, strz(TABLE))),
        message(
            nft | NFT_MSG_NEWCHAIN,
            new | NLM_F_EXCL,
            5,
            NFPROTO_IPV4,
            0,
            attr(NFTA_CHAIN_TABLE, strz(TABLE)),
            attr(NFTA_CHAIN_NAME, strz(CHAIN)),
            hook,
            attr(NFTA_CHAIN_TYPE, strz("filter")),
        ),
        message(
            nft | NFT_MSG_NEWRULE,
            new | NLM_F_APPEND,
            6,
            NFPROTO_IPV4,
            0,
            attr(NFTA_RULE_TABLE, strz(TABLE)),
            attr(NFTA_RULE_CHAIN, strz(CHAIN)),
            expressions,
        ),
        message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, 7, socket.AF_UNSPEC, NFNL_SUBSYS_NFTABLES),
    ]
    return b"".join(parts), {2, 3, 4, 5, 6}


def queue_config(queue: int) -> tuple[bytes, set[int]]:
    """Bind ``queue``, copy metadata only, hold up to QUEUE_MAXLEN packets, take GSO packets whole."""
    cfg = NFNL_SUBSYS_QUEUE << 8 | NFQNL_MSG_CONFIG
    flags = NLM_F_REQUEST | NLM_F_ACK
    bind = attr(NFQA_CFG_CMD, struct.pack(">BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_INET))
    params = attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))
    maxlen = attr(NFQA_CFG_QUEUE_MAXLEN, be32(QUEUE_MAXLEN))
    gso = attr(NFQA_CFG_MASK, be32(NFQA_CFG_F_GSO)) + attr(NFQA_CFG_FLAGS, be32(NFQA_CFG_F_GSO))
    parts = [
        message(cfg, flags, 11, socket.AF_UNSPEC, queue, bind),
        message(cfg, flags, 12, socket.AF_UNSPEC, queue, params, maxlen, gso),
    ]
    return b"".join(parts), {11, 12}


def messages(data: bytes):
    """(type, seq, payload after nlmsghdr) of each netlink message in ``data``."""
    offset = 0
    while offset + 16 <= len(data):
        length, kind, _, seq, _ = struct.unpack_from("=IHHII", data, offset)
        if length < 16:
            break
        yield kind, seq, data[offset + 16 : offset + length]
        offset += (length + 3) & ~3


def request(sock: socket.socket, data: bytes, seqs: set[int], what: str) -> None:
    """Send ``data`` and wait for the acknowledgement of every sequence number in ``seqs``;
    raise naming ``what`` on the first error the kernel reports."""
    sock.send(data)
    waiting = set(seqs)
    while waiting:
        for kind, seq, payload in messages(sock.recv(1 << 16)):
            if kind != NLMSG_ERROR:
                continue
            (code,) = struct.unpack_from("=i", payload)
            if code != 0:
                raise OSError(-code, f"{what}: the kernel refused it: {errno.errorcode.get(-code, -code)}")
            waiting.discard(seq)


def packet_id(payload: bytes) -> int | None:
    """The id in a queued packet's NFQA_PACKET_HDR (the attributes follow the 4-byte nfgenmsg)."""
    offset = 4
    while offset + 4 <= len(payload):
        length, kind = struct.unpack_from("=HH", payload, offset)
        if length < 4:
            return None
        if kind & ~NLA_F_NESTED == NFQA_PACKET_HDR:
            return struct.unpack_from(">I", payload, offset + 4)[0]
        offset += (length + 3) & ~3
    return None


def release(sock: socket.socket, queue: int, last_id: int) -> None:
    """Accept, in order, every packet of ``queue`` with an id up to ``last_id``."""
    verdict = attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, last_id))
    kind = NFNL_SUBSYS_QUEUE << 8 | NFQNL_MSG_VERDICT_BATCH
    sock.send(message(kind, NLM_F_REQUEST, 0, socket.AF_UNSPEC, queue, verdict))


def run(ifname: str, delay_s: float, queue: int) -> None:
    ifindex = socket.if_nametoindex(ifname)
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)  # SO_RCVBUFFORCE (root): past rmem_max
    sock.bind((0, 0))
    request(sock, *queue_config(queue), what=f"binding netfilter queue {queue}")
    request(sock, *rule_batch(ifindex, queue), what=f"the nf_tables rule that queues what leaves {ifname}")
    sock.setblocking(False)
    print("ready", flush=True)
    held: collections.deque[tuple[float, int]] = collections.deque()  # (due, packet id), in arrival order
    while True:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else None
        select.select([sock], [], [], timeout)  # select: microseconds (epoll waits whole milliseconds)
        while True:
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno != errno.ENOBUFS:  # the kernel dropped packets it could not tell us of: a lossy link
                    raise
                continue
            now = time.monotonic()
            for kind, _, payload in messages(data):
                if kind == NFNL_SUBSYS_QUEUE << 8 | NFQNL_MSG_PACKET:
                    pid = packet_id(payload)
                    if pid is not None:
                        held.append((now + delay_s, pid))
                elif kind == NLMSG_ERROR and struct.unpack_from("=i", payload)[0] != 0:
                    code = -struct.unpack_from("=i", payload)[0]
                    raise OSError(code, f"a verdict was refused: {errno.errorcode.get(code, code)}")
        now = time.monotonic()
        last = None
        while held and held[0][0] <= now:
            last = held.popleft()[1]
        if last is not None:
            release(sock, queue, last)


def main() -> None:
    if len(sys.argv) not in (3, 4):
        sys.exit(f"usage: {sys.argv[0]} IFNAME DELAY_US [QUEUE]")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK: 1 ns, not 50 us
    except (OSError, AttributeError):
        pass
    try:
        run(sys.argv[1], int(sys.argv[2]) / 1e6, int(sys.argv[3]) if len(sys.argv) == 4 else 0)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
