"""outboxd's Python client.

- `enqueue(conn, topic, type, payload, ...)`: a message in the caller's own transaction
  (psycopg 3 on PostgreSQL, `sqlite3` on outboxd's SQLite file).
- `ack_in(conn, consumer, message_id)`: the transactional ack.
- `Subscriber(server, consumer, handler, ...)`: an asyncio consumer; `await run()`, `stop()`.
- `AdminClient(server, token=None, tls=None)`: the admin API.
- `pb`: the generated protobuf messages and stubs.
"""

from outboxd import pb
from outboxd._admin import AdminClient
from outboxd._connection import TLSConfig, __version__
from outboxd._errors import ConfigError, InvalidMessage, OutboxdError
from outboxd._produce import ack_in, enqueue, uuid7
from outboxd._subscriber import Delivery, Handler, Subscriber

__all__ = [
    "AdminClient",
    "ConfigError",
    "Delivery",
    "Handler",
    "InvalidMessage",
    "OutboxdError",
    "Subscriber",
    "TLSConfig",
    "__version__",
    "ack_in",
    "enqueue",
    "pb",
    "uuid7",
]
