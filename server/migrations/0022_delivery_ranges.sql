-- One place for the ranges of first deliveries (ADR 0065, step two of ADR 0064).
--
-- A consumer's first deliveries that need no row of their own were held in three tables, one
-- per state: `pending_batches` (ADR 0042), `lease_batches` (ADR 0041) and `ack_log`. They are
-- now the rows of one table, `delivery_ranges`, whose `state` says which: a seq in a range of
-- state `pending` is pending for the consumer (due, count 0), in one of state `leased` is leased
-- to `leased_by` until `lease_expires_at` (count 1), in one of state `acked` was acked at `at`
-- (count 1). A range's state never changes: a lease moves seqs from a pending range into a new
-- leased one, a stream's ack from a leased range into a new acked one. A seq is in at most one
-- range of a consumer. A row of `outbox.deliveries` for the same message and consumer always
-- decides over a range (the exception rows: retries, dead letters, keyed and delayed messages,
-- replays, releases, expiries, transactional acks).
--
-- For a release that still reads the three tables (a replica during the roll that follows this
-- migration, docs/deploying.md), each is now a view of its share of the ranges, with its old
-- columns. PostgreSQL updates and deletes through such a view, so that release keeps working;
-- nothing writes new rows through them (only its relay pass and ack functions inserted, and the
-- functions are this release's). The views go in a later release.

-- Ids in the order ranges are written (a lease takes a consumer's oldest pending range first).
CREATE SEQUENCE outbox.delivery_ranges_id AS bigint;

-- One table, one partition per state: the statements of the delivery path name the state they
-- read, so each reads only its partition, and the acked ranges (history, kept until the prune)
-- never lengthen what a relay pass, a lease or an ack reads, as when they had tables of their
-- own. A range's state never changes, so no row moves between partitions.
CREATE TABLE outbox.delivery_ranges (
    id               bigint         NOT NULL DEFAULT nextval('outbox.delivery_ranges_id'),
    -- No foreign key to consumers: a key check per write would lock the consumer's row for every
    -- pass, lease and ack; consumer deletion deletes these rows itself.
    consumer         text           NOT NULL,
    state            text           NOT NULL CHECK (state IN ('pending', 'leased', 'acked')),
    seqs             int8multirange NOT NULL,
    -- The smallest range that held every seq the range was written with. Seqs only ever leave
    -- a range, so it still holds them all; it is never updated, so that an index of it leaves
    -- the updates of `seqs` by leases and acks HOT (an index of `seqs` itself would not).
    span             int8range      NOT NULL,
    leased_by        text,
    lease_expires_at timestamptz,
    -- When the range was written (pending, leased) or its seqs acked (acked).
    at               timestamptz    NOT NULL,
    CONSTRAINT delivery_ranges_lease CHECK ((state = 'leased') = (leased_by IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT delivery_ranges_span CHECK (span @> range_merge(seqs))
) PARTITION BY LIST (state);
ALTER SEQUENCE outbox.delivery_ranges_id OWNED BY outbox.delivery_ranges.id;
-- Leases and acks update `seqs` only: room on the page keeps those updates HOT.
CREATE TABLE outbox.delivery_ranges_pending PARTITION OF outbox.delivery_ranges
    FOR VALUES IN ('pending') WITH (fillfactor = 50);
CREATE TABLE outbox.delivery_ranges_leased PARTITION OF outbox.delivery_ranges
    FOR VALUES IN ('leased') WITH (fillfactor = 50);
CREATE TABLE outbox.delivery_ranges_acked PARTITION OF outbox.delivery_ranges
    FOR VALUES IN ('acked');
-- No writer of the old tables may commit between the copy and the drop. The lock waits for
-- open transactions that wrote them (a consumer's transactional ack holds its lock until the
-- consumer commits), and everything of the release before queues behind it meanwhile: bounded,
-- so that a long transaction fails the migration (run it again) instead of stalling delivery.
SET LOCAL lock_timeout = '10s';
LOCK TABLE outbox.lease_batches, outbox.pending_batches, outbox.ack_log IN ACCESS EXCLUSIVE MODE;

-- Pending ranges keep their order (a lease takes the oldest first).
INSERT INTO outbox.delivery_ranges (consumer, state, seqs, span, at)
SELECT p.consumer, 'pending', p.seqs, range_merge(p.seqs), p.created_at FROM outbox.pending_batches p
 WHERE NOT isempty(p.seqs) ORDER BY p.id;
INSERT INTO outbox.delivery_ranges (consumer, state, seqs, span, leased_by, lease_expires_at, at)
SELECT b.consumer, 'leased', b.seqs, range_merge(b.seqs), b.leased_by, b.lease_expires_at, b.created_at
  FROM outbox.lease_batches b
 WHERE NOT isempty(b.seqs) ORDER BY b.id;
INSERT INTO outbox.delivery_ranges (consumer, state, seqs, span, at)
SELECT a.consumer, 'acked', a.seqs, range_merge(a.seqs), a.at FROM outbox.ack_log a WHERE NOT isempty(a.seqs) ORDER BY a.at;

-- Indexes after the copy (built once, not row by row), each partition its own. An acked range
-- is written once per stream ack and read only by history's readers: it has the two indexes
-- `ack_log` had, no more (each is one more write per ack). Pending and leased ranges are found
-- by id (unique per partition; no key spans the partitions).
CREATE UNIQUE INDEX delivery_ranges_pending_id ON outbox.delivery_ranges_pending (id);
CREATE UNIQUE INDEX delivery_ranges_leased_id ON outbox.delivery_ranges_leased (id);
-- A consumer's ranges in the order they were written: a lease takes the oldest pending ones
-- first; acks, releases and stats find a consumer's leased ones.
CREATE INDEX delivery_ranges_pending_consumer ON outbox.delivery_ranges_pending (consumer, id);
CREATE INDEX delivery_ranges_leased_consumer ON outbox.delivery_ranges_leased (consumer, id);
CREATE INDEX delivery_ranges_leased_expiry ON outbox.delivery_ranges_leased (lease_expires_at);
-- The pending and leased ranges that may hold a seq (acks, `outbox.inbox`), by their span.
CREATE INDEX delivery_ranges_pending_span ON outbox.delivery_ranges_pending USING gist (span);
CREATE INDEX delivery_ranges_leased_span ON outbox.delivery_ranges_leased USING gist (span);
-- Acked ranges by their seqs (only a replay updates one): when a seq was acked (`GetMessage`
-- through `outbox.inbox`, the prune's count, and the previous release's readers of `ack_log`).
CREATE INDEX delivery_ranges_acked_seqs ON outbox.delivery_ranges_acked USING gist (seqs);
CREATE INDEX delivery_ranges_acked_at ON outbox.delivery_ranges_acked (at);

-- Every delivery of every message to every consumer, wherever it is held: the one definition of
-- "a row decides over a range" for reads that go message by message (`GetMessage`'s timeline,
-- replay's candidates, checks from outside). A seq of a range is the range's delivery unless the
-- consumer has a row for its message. A query for one message finds the ranges that may hold
-- its seq by their span's index; a scan of every delivery reads each range's messages by a
-- range scan of the primary key.
CREATE OR REPLACE VIEW outbox.inbox AS
    SELECT d.message_id, d.consumer, d.seq, d.ordering_key, d.state, d.delivery_count, d.available_at,
           d.lease_expires_at, d.leased_by, d.last_error, d.created_at, d.updated_at, d.acked_at, d.dead_at
      FROM outbox.deliveries d
    UNION ALL
    SELECT m.message_id, r.consumer, m.seq, m.ordering_key, r.state,
           CASE WHEN r.state = 'pending' THEN 0 ELSE 1 END, m.available_at,
           r.lease_expires_at, r.leased_by, NULL::text, r.at, r.at,
           CASE WHEN r.state = 'acked' THEN r.at END, NULL::timestamptz
      FROM outbox.delivery_ranges r
      JOIN outbox.messages m
        ON m.seq >= lower(r.seqs) AND m.seq < upper(r.seqs) AND r.span @> m.seq AND r.seqs @> m.seq
     WHERE NOT EXISTS (SELECT 1 FROM outbox.deliveries x WHERE x.message_id = m.message_id AND x.consumer = r.consumer);

-- The view now reads the new table (same columns, so grants on it stay); the old tables go.
DROP TABLE outbox.pending_batches, outbox.lease_batches, outbox.ack_log;

CREATE VIEW outbox.pending_batches AS
    SELECT r.id, r.consumer, r.seqs, r.at AS created_at FROM outbox.delivery_ranges r WHERE r.state = 'pending';
CREATE VIEW outbox.lease_batches AS
    SELECT r.id, r.consumer, r.leased_by, r.seqs, r.lease_expires_at, r.at AS created_at
      FROM outbox.delivery_ranges r WHERE r.state = 'leased';
CREATE VIEW outbox.ack_log AS
    SELECT r.consumer, r.seqs, r.at FROM outbox.delivery_ranges r WHERE r.state = 'acked';

-- The previous release's SQL functions insert into the old names until this release's replace
-- them (right after the migrations, in a transaction of its own): the views take those inserts
-- too. The one function a migration defines since 0015; server/sql/functions.sql holds the same
-- body (its test allows this one), and it goes with the views.
CREATE FUNCTION outbox.delivery_ranges_insert_through_view() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF TG_TABLE_NAME = 'pending_batches' THEN
        INSERT INTO outbox.delivery_ranges (consumer, state, seqs, span, at)
        VALUES (NEW.consumer, 'pending', NEW.seqs, range_merge(NEW.seqs), NEW.created_at)
        RETURNING id INTO NEW.id;
    ELSIF TG_TABLE_NAME = 'lease_batches' THEN
        INSERT INTO outbox.delivery_ranges (consumer, state, seqs, span, leased_by, lease_expires_at, at)
        VALUES (NEW.consumer, 'leased', NEW.seqs, range_merge(NEW.seqs), NEW.leased_by, NEW.lease_expires_at,
                NEW.created_at)
        RETURNING id INTO NEW.id;
    ELSE
        INSERT INTO outbox.delivery_ranges (consumer, state, seqs, span, at)
        VALUES (NEW.consumer, 'acked', NEW.seqs, range_merge(NEW.seqs), NEW.at);
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER insert_through_view INSTEAD OF INSERT ON outbox.pending_batches
    FOR EACH ROW EXECUTE FUNCTION outbox.delivery_ranges_insert_through_view();
CREATE TRIGGER insert_through_view INSTEAD OF INSERT ON outbox.lease_batches
    FOR EACH ROW EXECUTE FUNCTION outbox.delivery_ranges_insert_through_view();
CREATE TRIGGER insert_through_view INSTEAD OF INSERT ON outbox.ack_log
    FOR EACH ROW EXECUTE FUNCTION outbox.delivery_ranges_insert_through_view();
