-- The relay follows a cursor over the log instead of updating every message it relays
-- (ADR 0026, part 1; ADR 0027).
--
-- `outbox.relay_cursor.position`: every seq at or below it has been read by a relay pass,
-- except those in `outbox.relay_gaps`: seq values below the highest one read that were not
-- visible when it was read. A gap is remembered with `open_until`, one past the transaction id
-- the pass takes after that read. It closes when its rows appear (the pass that sees them relays
-- them) or, still missing, once every transaction that may hold one of its seq values has ended
-- (`pg_snapshot_xmin` of a snapshot taken before a later read is at or past `open_until`): a
-- rolled-back insert, or a sequence value never used. A long transaction elsewhere in the
-- database keeps gaps open longer; it never holds back what is visible.
--
-- That rule needs the holder of a seq to have its transaction id before it takes the seq: a
-- transaction gets its id at its first write, which for an outbox-only transaction is this very
-- insert, after the default is evaluated. So `seq` now defaults to `outbox.next_seq()`, which
-- assigns the transaction id first.

CREATE SEQUENCE outbox.messages_seq AS bigint;
-- Past every value the identity column has handed out, used or rolled back.
DO $$
DECLARE
    v_last bigint;
BEGIN
    EXECUTE format('SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM %s',
                   pg_get_serial_sequence('outbox.messages', 'seq'))
       INTO v_last;
    PERFORM setval('outbox.messages_seq',
                   greatest(v_last, (SELECT coalesce(max(seq), 0) FROM outbox.messages)) + 1, false);
END
$$;

-- A plain SQL expression, so that the planner inlines it into every insert: no function call.
-- Writers insert as the owner (outboxd's login, or `outbox.enqueue`, which runs with the
-- owner's rights); another login granted INSERT on the table also needs USAGE on the sequence.
CREATE FUNCTION outbox.next_seq() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    -- The transaction id first (CASE evaluates its condition before its result).
    SELECT CASE WHEN pg_catalog.pg_current_xact_id() IS NOT NULL
                THEN pg_catalog.nextval('outbox.messages_seq'::pg_catalog.regclass) END
$$;
GRANT EXECUTE ON FUNCTION outbox.next_seq() TO PUBLIC;

ALTER TABLE outbox.messages ALTER COLUMN seq DROP IDENTITY;
ALTER TABLE outbox.messages ALTER COLUMN seq SET DEFAULT outbox.next_seq();
ALTER SEQUENCE outbox.messages_seq OWNED BY outbox.messages.seq;

CREATE TABLE outbox.relay_cursor (
    one      boolean PRIMARY KEY DEFAULT true CHECK (one),
    position bigint      NOT NULL,
    moved_at timestamptz NOT NULL
);

CREATE TABLE outbox.relay_gaps (
    open_until xid8 PRIMARY KEY,
    seqs       int8multirange NOT NULL
);

-- When each seq was relayed: one row per pass, naming the seq values it relayed. For
-- `GetMessage` and `Tail`; pruned with the messages.
CREATE TABLE outbox.relay_log (
    seqs int8multirange NOT NULL,
    at   timestamptz    NOT NULL
);
CREATE INDEX relay_log_seqs ON outbox.relay_log USING gist (seqs);

-- Where today's rows stand: the highest relayed seq is the position; the unrelayed ones below it
-- are a gap that the next pass reads (they are committed, so it sees them).
INSERT INTO outbox.relay_cursor (position, moved_at)
SELECT coalesce(max(seq) FILTER (WHERE relayed_at IS NOT NULL), 0), now() FROM outbox.messages;
INSERT INTO outbox.relay_gaps (open_until, seqs)
SELECT (pg_current_xact_id()::text::bigint + 1)::text::xid8, range_agg(int8range(m.seq, m.seq + 1))
  FROM outbox.messages m
 WHERE m.relayed_at IS NULL AND m.seq < (SELECT position FROM outbox.relay_cursor)
HAVING count(*) > 0;

-- Nothing finds unrelayed rows by `relayed_at` any more; the column keeps the relay time of rows
-- relayed before this migration.
DROP INDEX outbox.messages_unrelayed;
DROP INDEX outbox.messages_unrelayed_ordering;

-- What the relay has not read yet: the messages after its position, and those in its open gaps
-- (each gap range read by primary key). For stats, the relay's "anything to do?" probe, and
-- checks from outside.
CREATE VIEW outbox.unrelayed_messages AS
    SELECT m.* FROM outbox.messages m WHERE m.seq > (SELECT c.position FROM outbox.relay_cursor c)
    UNION ALL
    SELECT u.* FROM outbox.relay_gaps g, unnest(g.seqs) r,
           LATERAL (SELECT * FROM outbox.messages m WHERE m.seq >= lower(r) AND m.seq < upper(r) OFFSET 0) u;

-- Whether the relay has read `seq`.
CREATE FUNCTION outbox.seq_relayed(seq bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT seq <= (SELECT c.position FROM outbox.relay_cursor c)
       AND NOT EXISTS (SELECT 1 FROM outbox.relay_gaps g WHERE g.seqs @> seq)
$$;

-- When a message was relayed (null while it waits for the relay).
CREATE FUNCTION outbox.message_relayed_at(seq bigint, relayed_at timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN relayed_at IS NOT NULL THEN relayed_at
        WHEN outbox.seq_relayed(seq) THEN (SELECT l.at FROM outbox.relay_log l WHERE l.seqs @> seq LIMIT 1)
    END
$$;

-- One relay pass, in the caller's transaction (autocommit: one round trip). As in migration
-- 0006, except for how messages are found and marked:
--  * takes the consumers lock shared, then the cursor row (relays take turns on it);
--  * reads, in seq order and up to `batch`, the visible messages in open gaps and after the
--    position; records the seq values it skipped below the highest one read as a new gap; moves
--    the position; logs what it relayed; closes the gaps whose holders have all ended;
--  * fans out and notifies as before. `from_seq` is no longer used (the cursor says where).
CREATE OR REPLACE FUNCTION outbox.relay_pass(
    batch          integer,
    from_seq       bigint,
    at             timestamptz,
    lock_key       bigint,
    notify         text,
    push_consumers text[],
    push_sessions  text[],
    push_room      integer[],
    push_until     timestamptz[]
) RETURNS TABLE (
    kind text, consumer text, session text, lease_expires_at timestamptz,
    message_id uuid, seq bigint, topic text, type text, payload bytea, headers jsonb,
    ordering_key text, enqueued_at timestamptz, available_at timestamptz, relayed_at timestamptz
)
LANGUAGE plpgsql VOLATILE
-- Its statements are short; JIT would compile them on every call (100 ms and more) whenever an
-- estimate runs high. outboxd's connections turn it off too; this holds behind poolers that
-- drop connection options.
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_position bigint;
    v_xmin     xid8;
    v_claimed  outbox.messages[];
    v_read     integer;
    v_read_to  bigint;
    v_found    int8multirange;
    v_missing  int8multirange;
    v_created  outbox.deliveries[];
    v_woken    text;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(lock_key);
    -- Relays take turns on the cursor under an advisory lock, not the row's lock: a row lock
    -- would give this transaction its id now, and the gap rule needs an id taken after the read.
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'outbox.relay_pass must run in a transaction of its own (this one has written already)';
    END IF;
    PERFORM pg_advisory_xact_lock(1869903970, 1);
    SELECT c.position INTO v_position FROM outbox.relay_cursor c;
    -- seq values only grow. A sequence set back (TRUNCATE ... RESTART IDENTITY, setval) would
    -- hand out values the cursor has passed, and their messages would never be relayed: refuse,
    -- loudly, instead.
    IF (SELECT s.last_value FROM outbox.messages_seq s) < v_position THEN
        RAISE EXCEPTION 'outbox.messages_seq is at %, behind the relay cursor at %: seq values must only grow',
                        (SELECT s.last_value FROM outbox.messages_seq s), v_position
              USING HINT = 'SELECT setval(''outbox.messages_seq'', (SELECT position FROM outbox.relay_cursor) + 1, false);',
                    ERRCODE = 'data_corrupted';
    END IF;
    -- Before the read: a gap whose holders had all ended by now shows every committed row of
    -- it to the read below, which has a later snapshot.
    v_xmin := pg_snapshot_xmin(pg_current_snapshot());

    SELECT array_agg(ROW(x.*)::outbox.messages ORDER BY x.seq) INTO v_claimed
      FROM (SELECT * FROM (
                SELECT u.* FROM outbox.relay_gaps g, unnest(g.seqs) r,
                       -- OFFSET 0: a range scan of the primary key per gap range.
                       LATERAL (SELECT * FROM outbox.messages m
                                 WHERE m.seq >= lower(r) AND m.seq < upper(r) OFFSET 0) u
                UNION ALL
                (SELECT m.* FROM outbox.messages m WHERE m.seq > v_position ORDER BY m.seq LIMIT batch)
            ) y ORDER BY y.seq LIMIT batch) x;
    v_read := coalesce(array_length(v_claimed, 1), 0);

    IF v_read > 0 THEN
        SELECT max(m.seq) FILTER (WHERE m.seq > v_position), range_agg(int8range(m.seq, m.seq + 1))
          INTO v_read_to, v_found
          FROM unnest(v_claimed) m;
        UPDATE outbox.relay_gaps g SET seqs = g.seqs - v_found WHERE g.seqs && v_found;
        IF v_read_to IS NOT NULL THEN
            -- Every visible row in (position, read_to] was read: the rest are not visible yet.
            v_missing := int8multirange(int8range(v_position + 1, v_read_to + 1)) - v_found;
            IF NOT isempty(v_missing) THEN
                -- The holder of a missing seq took its transaction id before the seq, so before
                -- the read; this transaction takes its id after the read (its first write is
                -- above, or this insert). Ids are handed out in order: every holder's id is
                -- below ours, and once the oldest running id is past ours they have all ended.
                -- (A snapshot's xmax is no such bound: it follows completed ids, not assigned ones.)
                INSERT INTO outbox.relay_gaps AS g (open_until, seqs)
                VALUES ((pg_current_xact_id()::text::bigint + 1)::text::xid8, v_missing)
                ON CONFLICT (open_until) DO UPDATE SET seqs = g.seqs + excluded.seqs;
            END IF;
            UPDATE outbox.relay_cursor SET position = v_read_to, moved_at = relay_pass.at;
        END IF;
        INSERT INTO outbox.relay_log (seqs, at) VALUES (v_found, relay_pass.at);
    END IF;
    -- A read cut short by the batch may have left rows of a gap unread: close gaps only after a
    -- read that took everything visible.
    DELETE FROM outbox.relay_gaps g
     WHERE isempty(g.seqs) OR (v_read < batch AND g.open_until <= v_xmin);

    IF v_read = 0 THEN
        RETURN;
    END IF;

    WITH claimed AS (
        SELECT * FROM unnest(v_claimed)
    ), fan AS (
        SELECT c.name AS consumer, m.message_id, m.seq, m.ordering_key, m.available_at,
               (m.ordering_key IS NULL AND m.available_at <= relay_pass.at AND NOT c.paused) AS pushable
          FROM claimed m
          JOIN outbox.consumers c ON m.seq > c.start_seq AND outbox.topic_matches(c.topics, m.topic)
    ), numbered AS (
        SELECT f.*, row_number() OVER (PARTITION BY f.consumer, f.pushable ORDER BY f.seq) AS rn
          FROM fan f
    ), room AS (
        SELECT r.consumer, r.session, r.until, r.room,
               sum(r.room) OVER (PARTITION BY r.consumer ORDER BY r.ord) AS upto
          FROM unnest(push_consumers, push_sessions, push_room, push_until) WITH ORDINALITY
               AS r(consumer, session, room, until, ord)
    ), planned AS (
        SELECT n.message_id, n.consumer, n.seq, n.ordering_key, n.available_at, r.session, r.until
          FROM numbered n
          LEFT JOIN room r ON n.pushable AND r.consumer = n.consumer
                          AND n.rn > r.upto - r.room AND n.rn <= r.upto
    ), created AS (
        INSERT INTO outbox.deliveries AS d (message_id, consumer, seq, ordering_key, state, delivery_count,
                                            available_at, lease_expires_at, leased_by, created_at, updated_at)
        SELECT p.message_id, p.consumer, p.seq, p.ordering_key,
               CASE WHEN p.session IS NULL THEN 'pending' ELSE 'leased' END,
               CASE WHEN p.session IS NULL THEN 0 ELSE 1 END,
               p.available_at, p.until, p.session, relay_pass.at, relay_pass.at
          FROM planned p
        ON CONFLICT ON CONSTRAINT deliveries_pkey DO NOTHING
        RETURNING d.*
    )
    SELECT array_agg(ROW(d.*)::outbox.deliveries) INTO v_created FROM created d;

    IF notify IS NOT NULL THEN
        SELECT string_agg(DISTINCT d.consumer, ',') INTO v_woken FROM unnest(v_created) d WHERE d.state = 'pending';
        IF v_woken IS NOT NULL THEN
            -- Too long a list for a notification: empty means "every consumer".
            PERFORM pg_notify(notify, CASE WHEN length(v_woken) > 7900 THEN '' ELSE v_woken END);
        END IF;
    END IF;
    RETURN QUERY
        SELECT 'm'::text, NULL::text, NULL::text, NULL::timestamptz,
               m.message_id, m.seq, m.topic, m.type, NULL::bytea, m.headers,
               m.ordering_key, m.enqueued_at, m.available_at, relay_pass.at
          FROM unnest(v_claimed) m
        UNION ALL
        SELECT CASE WHEN d.state = 'leased' THEN 'p' ELSE 'd' END, d.consumer, d.leased_by, d.lease_expires_at,
               m.message_id, m.seq, m.topic, m.type, CASE WHEN d.state = 'leased' THEN m.payload END, m.headers,
               m.ordering_key, m.enqueued_at, m.available_at, relay_pass.at
          FROM unnest(v_created) d JOIN unnest(v_claimed) m ON m.message_id = d.message_id;
END
$$;
