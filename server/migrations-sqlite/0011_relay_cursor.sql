-- The relay reads after a cursor instead of claiming each message (ADR 0066), as PostgreSQL's
-- relay does (its migration 0010), without the gaps: SQLite lets one writer commit at a time and
-- hands out seq values inside the writer's transaction, so no seq at or below the highest
-- committed one can commit later (values a duplicate insert used up are skipped for good).
-- A message is relayed once its seq is at or below
-- `position`; when it was relayed is in `outbox_relay_log`, one row per pass (the seqs `lo` to
-- `hi`). A relay pass no longer rewrites every message it reads (its payload with it) to set
-- `relayed_at`, and producers' inserts no longer maintain an index of unrelayed messages.
-- `relayed_at` keeps the time of messages relayed before this migration.
CREATE TABLE outbox_relay_cursor (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    position INTEGER NOT NULL
);
-- Below the lowest unrelayed message, or after the highest seq ever handed out. A message above
-- it that an older release relayed already is read again once; its deliveries exist, and a pass
-- writes none twice (ON CONFLICT DO NOTHING).
INSERT INTO outbox_relay_cursor (id, position)
VALUES (1, coalesce((SELECT min(seq) - 1 FROM outbox_messages WHERE relayed_at IS NULL),
                    (SELECT seq FROM sqlite_sequence WHERE name = 'outbox_messages'),
                    0));

CREATE TABLE outbox_relay_log (
    hi INTEGER PRIMARY KEY,
    lo INTEGER NOT NULL,
    at INTEGER NOT NULL
) WITHOUT ROWID;

DROP INDEX outbox_messages_unrelayed;
DROP INDEX outbox_messages_unrelayed_ordering;
-- A key's messages in seq order: whether one the relay has not read yet comes before a
-- delivery's (a lease must not pass it). Keyed messages only.
CREATE INDEX outbox_messages_keyed ON outbox_messages (ordering_key, seq) WHERE ordering_key IS NOT NULL;

-- A seq at or below the cursor would never be relayed: only a producer that sets `seq` itself
-- can write one (the documented insert leaves it to SQLite). Refused, loudly, as PostgreSQL
-- refuses a sequence set back.
CREATE TRIGGER outbox_messages_seq_after_cursor AFTER INSERT ON outbox_messages
    WHEN NEW.seq <= (SELECT c.position FROM outbox_relay_cursor c WHERE c.id = 1)
BEGIN
    SELECT RAISE(ABORT, 'outbox_messages: seq must be above the relay cursor (outbox_relay_cursor.position): leave seq to SQLite');
END;
-- Nor may a message's seq change: below the cursor it would never be relayed, above it it would
-- be relayed again.
CREATE TRIGGER outbox_messages_seq_fixed AFTER UPDATE OF seq ON outbox_messages
    WHEN NEW.seq <> OLD.seq
BEGIN
    SELECT RAISE(ABORT, 'outbox_messages: seq cannot change once a message is written');
END;
