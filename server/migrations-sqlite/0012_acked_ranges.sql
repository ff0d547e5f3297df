-- Acked first deliveries as ranges (ADR 0070, step 5 of ADR 0064): the place PostgreSQL keeps
-- them (its `delivery_ranges` rows of state 'acked'). A stream's ack of a first delivery that a
-- range can say (leased, delivered once, unkeyed, no error) deletes its row and records its seq
-- here; every other delivery stays a row of `outbox_deliveries`, which decides over a range
-- holding the same seq (a replayed delivery). The documented transactional ack is unchanged:
-- every delivery a consumer can still ack is a row.
--
-- One row per run of consecutive seqs that one ack acked: the seqs `lo` to `hi - 1`, all of
-- them messages of `consumer`, acked at `at`. The rows of one consumer never overlap.
CREATE TABLE outbox_acked_ranges (
    consumer TEXT    NOT NULL REFERENCES outbox_consumers (name) ON DELETE CASCADE,
    lo       INTEGER NOT NULL,
    hi       INTEGER NOT NULL CHECK (hi > lo),
    at       INTEGER NOT NULL,
    PRIMARY KEY (consumer, lo)
) WITHOUT ROWID;

-- Every consumer's delivery of every message, wherever it is held: a row, or a seq in an acked
-- range for which the consumer has no row (a row decides over a range). The same columns as
-- PostgreSQL's `outbox.inbox`; a range-held delivery has count 1 and the range's time as
-- `created_at`, `updated_at` and `acked_at`. The one definition that `GetMessage` reads
-- through, message by message: the range of a message for a consumer is one probe of the primary
-- key (the range with the highest `lo` at or below the seq), and `CROSS JOIN` keeps that order
-- (message, consumer, range) whatever the statistics say.
CREATE VIEW outbox_inbox AS
    SELECT d.message_id, d.consumer, d.seq, d.ordering_key, d.state, d.delivery_count, d.available_at,
           d.lease_expires_at, d.leased_by, d.last_error, d.created_at, d.updated_at, d.acked_at, d.dead_at
      FROM outbox_deliveries d
    UNION ALL
    SELECT m.message_id, r.consumer, m.seq, m.ordering_key, 'acked', 1, coalesce(m.available_at, m.enqueued_at),
           NULL, NULL, NULL, r.at, r.at, r.at, NULL
      FROM outbox_messages m
      CROSS JOIN outbox_consumers c
      CROSS JOIN outbox_acked_ranges r
        ON r.consumer = c.name AND m.seq >= r.lo AND m.seq < r.hi
       AND r.lo = (SELECT max(x.lo) FROM outbox_acked_ranges x WHERE x.consumer = c.name AND x.lo <= m.seq)
     WHERE NOT EXISTS (SELECT 1 FROM outbox_deliveries d WHERE d.message_id = m.message_id AND d.consumer = c.name);
