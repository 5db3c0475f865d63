"""Per-peer, per-operation metrics: a runtime's own (`Runtime.metrics`) and a peer's, asked
with a stats request (`remote_stats`, what ``commctl stats`` sends).

Both come from the same JSON document (``docs/wire-format.md``, section 4.11), parsed into
dataclasses: `Metrics` holds one `PeerMetrics` per peer and role (``"client"``: requests
this task sent to the peer; ``"server"``: requests the peer sent to this task), each with an
`OpMetrics` per operation (``"pull"``, ``"push_rows"``, ...): requests by outcome, bytes,
tensors and rows, and a `Latency` histogram; `Metrics.tables` the `TableMetrics` of each
table the task serves.
"""

from __future__ import annotations

import ctypes as C
import json
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from . import _lib
from .client import Client, _ms, _reply_text
from .errors import check, from_code
from .ps_table import HotId, TableMetrics

_R = _lib.R
_client_stats = _lib._sig("sw_client_stats", _R, _lib.p, C.c_char_p, C.c_uint64, _lib.u64p)

#: The outcomes a request can end with.
OUTCOMES = ("ok", "error", "timeout", "unavailable", "refused")


@dataclass
class Latency:
    """Latencies of the answered requests, in nanoseconds: percentiles (the upper end of
    the histogram bucket holding them, at most 1/8 above the true value) and the buckets,
    ``(upper_ns, count)`` in increasing order."""

    count: int = 0
    sum_ns: int = 0
    max_ns: int = 0
    p50_ns: int = 0
    p90_ns: int = 0
    p99_ns: int = 0
    buckets: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Latency":
        return cls(count=d.get("count", 0), sum_ns=d.get("sum_ns", 0),
                   max_ns=d.get("max_ns", 0), p50_ns=d.get("p50_ns", 0),
                   p90_ns=d.get("p90_ns", 0), p99_ns=d.get("p99_ns", 0),
                   buckets=[(int(u), int(c)) for u, c in d.get("buckets", [])])


@dataclass
class OpMetrics:
    """One operation's requests with one peer."""

    requests: int = 0
    in_flight: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    bytes_out: int = 0
    bytes_in: int = 0
    tensors: int = 0
    rows: int = 0
    latency: Latency = field(default_factory=Latency)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OpMetrics":
        return cls(requests=d.get("requests", 0), in_flight=d.get("in_flight", 0),
                   outcomes={k: int(v) for k, v in d.get("outcomes", {}).items()},
                   bytes_out=d.get("bytes_out", 0), bytes_in=d.get("bytes_in", 0),
                   tensors=d.get("tensors", 0), rows=d.get("rows", 0),
                   latency=Latency.from_dict(d.get("latency", {})))

    @property
    def ok(self) -> int:
        """Requests answered."""
        return self.outcomes.get("ok", 0)


@dataclass
class PeerMetrics:
    """One peer in one role: ``addr`` (requests this task sent it) and ``task`` (its
    ``job:index``, from the requests that named it by task or from the handshake),
    connections, and its operations by name."""

    role: str
    addr: Optional[str]
    task: Optional[str]
    connections: int = 0
    connections_lost: int = 0
    reconnects: int = 0
    ops: dict[str, OpMetrics] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PeerMetrics":
        return cls(role=d.get("role", ""), addr=d.get("addr"), task=d.get("task"),
                   connections=d.get("connections", 0),
                   connections_lost=d.get("connections_lost", 0),
                   reconnects=d.get("reconnects", 0),
                   ops={k: OpMetrics.from_dict(v) for k, v in d.get("ops", {}).items()})


@dataclass
class Metrics:
    """A task's metrics: its name, totals and peers."""

    task: str
    version: int
    totals: dict[str, int]
    peers: list[PeerMetrics]
    truncated: bool = False
    #: The tables the task serves that keep metrics (its `PsTable`s), by table id: rows,
    #: bytes, calls, rows pulled and pushed, creations, evictions, the hottest ids.
    tables: dict[int, TableMetrics] = field(default_factory=dict)

    @classmethod
    def from_json(cls, text: str) -> "Metrics":
        d = json.loads(text)
        if d.get("format") != "starwire-stats":
            raise ValueError(f"not a starwire stats document: format {d.get('format')!r}")
        return cls(task=d.get("task", ""), version=d.get("version", 0),
                   totals={k: int(v) for k, v in d.get("totals", {}).items()},
                   peers=[PeerMetrics.from_dict(p) for p in d.get("peers", [])],
                   truncated=bool(d.get("truncated", False)),
                   tables={int(t["table"]): _table_metrics(t) for t in d.get("tables", [])})

    def client(self, addr: str) -> Optional[PeerMetrics]:
        """Requests this task sent to `addr` (``host:port``)."""
        return next((p for p in self.peers if p.role == "client" and p.addr == addr), None)

    def served(self, task: str) -> Optional[PeerMetrics]:
        """Requests task `task` (``job:index``) sent to this one."""
        return next((p for p in self.peers if p.role == "server" and p.task == task), None)


_TABLE_FIELDS = [f.name for f in fields(TableMetrics) if f.name != "hot"]


def _table_metrics(d: dict[str, Any]) -> TableMetrics:
    """A table of a stats document (its counters under the names `TableMetrics` has)."""
    return TableMetrics(**{name: int(d.get(name, 0)) for name in _TABLE_FIELDS},
                        hot=[HotId(int(i), int(n)) for i, n in d.get("hot", [])])


def remote_stats(client: Client, peer: str, timeout: Optional[float] = 5.0) -> Metrics:
    """`peer`'s metrics, asked with a stats request through `client` (``peer`` is
    ``host:port`` or a task name the runtime resolves). A peer with the stats endpoint off
    raises `RemoteError` with status ``UNIMPLEMENTED``."""
    tag = C.c_uint64()
    check(_client_stats(client._handle(), client.runtime._peer(peer), _ms(timeout),
                        C.byref(tag)))
    reply = C.c_void_p()
    code = _lib.client_wait(client._handle(), tag.value, C.byref(reply))
    if code:
        raise from_code(code)
    return Metrics.from_json(_reply_text(reply.value or 0))
