"""outboxd's Python client.

- `enqueue(conn, topic, type, payload, ...)`: a message in the caller's own transaction
  (psycopg 3 on PostgreSQL, `sqlite3` on outboxd's SQLite file).
- `ack_in(conn, consumer, message_id)`: the transactional ack.
- `Subscriber(server, consumer, handler, ...)`: an asyncio consumer; `await run()`, `stop()`.
- `AdminClient(server, token=None, tls=None)`: the admin API; its answers are the frozen
  dataclasses `Consumer`, `Stats`, `MessageInfo`, `DeadLetterPage`, `HeldKeys`, ... (each
  keeps its protobuf message in `.raw`).
- `pb`: the generated protobuf messages and stubs.
"""

from outboxd import pb
from outboxd._admin import AdminClient
from outboxd._connection import TLSConfig, __version__
from outboxd._errors import ConfigError, InvalidMessage, OutboxdError
from outboxd._produce import ack_in, enqueue, uuid7
from outboxd._subscriber import Delivery, Handler, Subscriber
from outboxd._types import (
    Consumer,
    ConsumerStats,
    DeadKeyPolicy,
    DeadLetter,
    DeadLetterPage,
    DeliveryState,
    DeliveryStatus,
    HeldKey,
    HeldKeys,
    Message,
    MessageInfo,
    PruneResult,
    ReplayProgress,
    ReplayResult,
    Sink,
    StartFrom,
    Stats,
    TableStats,
    VacuumHorizon,
)

__all__ = [
    "AdminClient",
    "ConfigError",
    "Consumer",
    "ConsumerStats",
    "DeadKeyPolicy",
    "DeadLetter",
    "DeadLetterPage",
    "Delivery",
    "DeliveryState",
    "DeliveryStatus",
    "Handler",
    "HeldKey",
    "HeldKeys",
    "InvalidMessage",
    "Message",
    "MessageInfo",
    "OutboxdError",
    "PruneResult",
    "ReplayProgress",
    "ReplayResult",
    "Sink",
    "StartFrom",
    "Stats",
    "Subscriber",
    "TableStats",
    "TLSConfig",
    "VacuumHorizon",
    "__version__",
    "ack_in",
    "enqueue",
    "pb",
    "uuid7",
]
