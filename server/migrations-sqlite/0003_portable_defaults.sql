-- no-transaction
-- Defaults and checks that every SQLite a producer is likely to link (3.31 and up) evaluates:
-- `enqueued_at` defaulted to unixepoch('subsec'), which SQLite before 3.42 answers with NULL, so
-- a producer on an older system library failed the documented INSERT. `julianday('now')` has
-- existed for ever and is kept to the millisecond; the default is that, in microseconds.
--
-- SQLite cannot change a column's default in place: the table is rebuilt (the documented
-- 12-step procedure), with foreign keys off so that dropping the old table does not cascade to
-- the deliveries that reference it, and the AUTOINCREMENT counter carried over, so that no seq is
-- ever handed out twice.
PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;
CREATE TABLE outbox_messages_v2 (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id    TEXT    NOT NULL UNIQUE DEFAULT (lower(
                      hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' ||
                      substr(hex(randomblob(2)), 2) || '-' ||
                      substr('89ab', 1 + (abs(random()) % 4), 1) || substr(hex(randomblob(2)), 2) || '-' ||
                      hex(randomblob(6))))
                  -- Lowercase, hyphenated: acks and replays match ids as text.
                  CHECK (message_id GLOB '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]'),
    topic         TEXT    NOT NULL CHECK (topic <> '' AND topic NOT GLOB '*[^A-Za-z0-9_.-]*'
                                          AND topic NOT GLOB '.*' AND topic NOT GLOB '*.'
                                          AND topic NOT GLOB '*..*'),
    type          TEXT    NOT NULL CHECK (type <> ''),
    payload       BLOB    NOT NULL,
    headers       TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(headers) AND json_type(headers) = 'object'),
    ordering_key  TEXT,
    -- Microseconds since the Unix epoch, to the millisecond (julianday is kept in milliseconds).
    enqueued_at   INTEGER NOT NULL DEFAULT (CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000),
    -- Not delivered before this instant; NULL means enqueued_at.
    available_at  INTEGER,
    relayed_at    INTEGER
);
INSERT INTO outbox_messages_v2 (seq, message_id, topic, type, payload, headers, ordering_key, enqueued_at,
                                available_at, relayed_at)
SELECT seq, message_id, topic, type, payload, headers, ordering_key, enqueued_at, available_at, relayed_at
  FROM outbox_messages;
-- The counter, not just the highest remaining seq: pruned messages' seqs are not reused.
INSERT INTO sqlite_sequence (name, seq)
SELECT 'outbox_messages_v2', 0 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'outbox_messages_v2');
UPDATE sqlite_sequence
   SET seq = max(seq, coalesce((SELECT s.seq FROM sqlite_sequence s WHERE s.name = 'outbox_messages'), 0))
 WHERE name = 'outbox_messages_v2';
DROP TABLE outbox_messages;
ALTER TABLE outbox_messages_v2 RENAME TO outbox_messages;
CREATE INDEX outbox_messages_unrelayed ON outbox_messages (seq) WHERE relayed_at IS NULL;
CREATE INDEX outbox_messages_enqueued_at ON outbox_messages (enqueued_at);
CREATE INDEX outbox_messages_unrelayed_ordering ON outbox_messages (ordering_key, seq)
    WHERE relayed_at IS NULL AND ordering_key IS NOT NULL;
COMMIT;
PRAGMA foreign_keys = ON;
