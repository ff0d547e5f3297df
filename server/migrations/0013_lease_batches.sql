-- First deliveries are leased in batches; rows only for what a batch cannot say (ADR 0041).
--
-- A relay pass that pushes messages to a stream no longer writes a `leased` row per message and
-- consumer: it writes one `outbox.lease_batches` row per stream, naming the seqs it leased there.
-- A seq in a batch is leased to `leased_by` until `lease_expires_at` with delivery count 1 —
-- unless the consumer has a row in `outbox.deliveries` for that message, which always wins.
-- Stream acks take seqs out of batches (`outbox.ack_batch`) and log when (`outbox.ack_log`);
-- every other transition first turns the seqs it touches into `leased` rows
-- (`outbox.unbatch`), then runs on rows as before.

-- No foreign key to consumers: a key check per write would lock the consumer's row for every
-- batch and ack; consumer deletion deletes these rows itself.
CREATE TABLE outbox.lease_batches (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer         text           NOT NULL,
    leased_by        text           NOT NULL,
    seqs             int8multirange NOT NULL,
    lease_expires_at timestamptz    NOT NULL,
    created_at       timestamptz    NOT NULL
) WITH (fillfactor = 50);  -- acks update `seqs` only: room on the page keeps them HOT
CREATE INDEX lease_batches_consumer ON outbox.lease_batches (consumer, leased_by);
CREATE INDEX lease_batches_expiry ON outbox.lease_batches (lease_expires_at);

-- When the seqs of a batch were acked, for `GetMessage`'s `acked_at`: one row per ack batch.
CREATE TABLE outbox.ack_log (
    consumer text           NOT NULL,
    seqs     int8multirange NOT NULL,
    at       timestamptz    NOT NULL
);
CREATE INDEX ack_log_seqs ON outbox.ack_log USING gist (seqs);
CREATE INDEX ack_log_at ON outbox.ack_log (at);

-- The highest seq an EARLIEST consumer's backfill wrote rows for (0 for NEW): only at or below
-- it can a message have a row for the consumer before the relay reads it. Existing consumers
-- may have such rows for anything written so far.
ALTER TABLE outbox.consumers ADD COLUMN backfill_seq bigint NOT NULL DEFAULT 0;
UPDATE outbox.consumers SET backfill_seq = (SELECT coalesce(max(seq), 0) FROM outbox.messages);

-- A stream's acks in one call: rows that are leased or pending become acked (as before); the
-- seqs are taken out of the consumer's batches (emptied batches go), and the time of the ack of
-- the batch-held ones is logged. Returns how many deliveries changed.
CREATE FUNCTION outbox.ack_batch(p_consumer text, p_ids uuid[], p_at timestamptz) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET jit = off AS $$
DECLARE
    v_rows  bigint;
    v_want  int8multirange;
    v_taken int8multirange;
BEGIN
    UPDATE outbox.deliveries d
       SET state = 'acked', acked_at = p_at, updated_at = p_at, lease_expires_at = NULL, leased_by = NULL
     WHERE d.consumer = p_consumer AND d.message_id = ANY (p_ids) AND d.state IN ('leased', 'pending');
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    SELECT range_agg(int8range(m.seq, m.seq + 1)) INTO v_want
      FROM outbox.messages m WHERE m.message_id = ANY (p_ids);
    IF v_want IS NULL THEN
        RETURN v_rows;
    END IF;
    WITH held AS (
        SELECT b.id, b.seqs * v_want AS taken FROM outbox.lease_batches b
         WHERE b.consumer = p_consumer AND b.seqs && v_want
           FOR UPDATE
    ), moved AS (
        UPDATE outbox.lease_batches b SET seqs = b.seqs - h.taken FROM held h WHERE b.id = h.id
        RETURNING h.taken
    )
    SELECT range_agg(r) INTO v_taken FROM moved, unnest(moved.taken) r;
    IF v_taken IS NULL THEN
        RETURN v_rows;
    END IF;
    DELETE FROM outbox.lease_batches b WHERE b.consumer = p_consumer AND isempty(b.seqs);
    -- A seq with a row of its own (a transactional ack got there first) was not the batch's to
    -- ack: it leaves the batch, but is neither logged nor counted.
    v_taken := v_taken - coalesce((SELECT range_agg(int8range(d.seq, d.seq + 1)) FROM outbox.deliveries d
                                    WHERE d.consumer = p_consumer AND d.message_id = ANY (p_ids)),
                                   '{}'::int8multirange);
    IF NOT isempty(v_taken) THEN
        INSERT INTO outbox.ack_log (consumer, seqs, at) VALUES (p_consumer, v_taken, p_at);
        v_rows := v_rows + (SELECT sum(upper(r) - lower(r)) FROM unnest(v_taken) r);
    END IF;
    RETURN v_rows;
END
$$;

-- Turns batch-held seqs into `leased` rows (count 1, the batch's holder and deadline), for a
-- release or the sweeper to run on: the pairs `(p_consumers[i], p_ids[i])`, or with null
-- arrays every seq of every batch whose deadline is at or before `p_expired_at`. Only batches
-- held by `p_session` (when given) and expired by `p_expired_at` (when given) are touched.
-- Returns how many rows it wrote.
CREATE FUNCTION outbox.unbatch(p_consumers text[], p_ids uuid[], p_session text, p_expired_at timestamptz)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SET jit = off AS $$
DECLARE
    v_rows bigint;
BEGIN
    WITH want AS (
        SELECT w.consumer, range_agg(int8range(m.seq, m.seq + 1)) AS seqs
          FROM unnest(p_consumers, p_ids) AS w(consumer, message_id)
          JOIN outbox.messages m ON m.message_id = w.message_id
         GROUP BY w.consumer
    ), held AS (
        SELECT b.id, b.consumer, b.leased_by, b.lease_expires_at, b.created_at,
               CASE WHEN p_ids IS NULL THEN b.seqs ELSE b.seqs * w.seqs END AS taken
          FROM outbox.lease_batches b
          LEFT JOIN want w ON w.consumer = b.consumer
         WHERE (p_ids IS NULL OR b.seqs && w.seqs)
           AND (p_session IS NULL OR b.leased_by = p_session)
           AND (p_expired_at IS NULL OR b.lease_expires_at <= p_expired_at)
           FOR UPDATE OF b
    ), moved AS (
        UPDATE outbox.lease_batches b SET seqs = b.seqs - h.taken FROM held h WHERE b.id = h.id
        RETURNING h.*
    ), rows AS (
        INSERT INTO outbox.deliveries AS d (message_id, consumer, seq, ordering_key, state, delivery_count,
                                            available_at, lease_expires_at, leased_by, created_at, updated_at)
        SELECT m.message_id, h.consumer, m.seq, m.ordering_key, 'leased', 1, m.available_at,
               h.lease_expires_at, h.leased_by, h.created_at, h.created_at
          FROM moved h, unnest(h.taken) r,
               LATERAL (SELECT * FROM outbox.messages m WHERE m.seq >= lower(r) AND m.seq < upper(r) OFFSET 0) m
        -- A row of its own wins (a transactional ack got there first).
        ON CONFLICT ON CONSTRAINT deliveries_pkey DO NOTHING
        RETURNING 1
    )
    SELECT count(*) INTO v_rows FROM rows;
    DELETE FROM outbox.lease_batches b WHERE isempty(b.seqs);
    RETURN v_rows;
END
$$;

-- The transactional ack keeps its contract (migration 0004): true once, false when the delivery
-- was already acked, is dead, or is unknown. A first delivery held in a batch gets its acked row
-- here; the batch's own ack later finds the row and leaves it alone.
CREATE OR REPLACE FUNCTION outbox.ack(consumer text, message_id uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rows bigint;
    v_seq  bigint;
BEGIN
    UPDATE outbox.deliveries d
       SET state = 'acked', acked_at = now(), updated_at = now(), lease_expires_at = NULL, leased_by = NULL
     WHERE d.consumer = $1 AND d.message_id = $2 AND d.state IN ('leased', 'pending');
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    IF v_rows > 0 THEN
        RETURN true;
    END IF;
    SELECT m.seq INTO v_seq FROM outbox.messages m WHERE m.message_id = $2;
    IF v_seq IS NULL OR NOT EXISTS (SELECT 1 FROM outbox.lease_batches b
                                     WHERE b.consumer = $1 AND b.seqs @> v_seq) THEN
        RETURN false;
    END IF;
    INSERT INTO outbox.deliveries AS d (message_id, consumer, seq, ordering_key, state, delivery_count,
                                        available_at, created_at, updated_at, acked_at)
    SELECT m.message_id, $1, m.seq, m.ordering_key, 'acked', 1, m.available_at, now(), now(), now()
      FROM outbox.messages m WHERE m.message_id = $2
    -- The sweeper turned the batch's seq into a row meanwhile: ack that row, as above.
    ON CONFLICT ON CONSTRAINT deliveries_pkey DO UPDATE
       SET state = 'acked', acked_at = now(), updated_at = now(), lease_expires_at = NULL, leased_by = NULL
     WHERE d.state IN ('leased', 'pending');
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows > 0;
END
$$;

-- As in migration 0010, except that the deliveries it pushes to streams are lease batches, and
-- that it never pushes a message that already has a row for the consumer.
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
    v_batches  outbox.lease_batches[];
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
               (m.ordering_key IS NULL AND m.available_at <= relay_pass.at AND NOT c.paused
                -- Only at or below the backfill's highest seq can a row exist already (an
                -- EARLIEST consumer's backfill writes rows for messages not relayed yet): a
                -- probe there, none in the steady state.
                AND (m.seq > c.backfill_seq
                     OR (SELECT 1 FROM outbox.deliveries x
                          WHERE x.message_id = m.message_id AND x.consumer = c.name) IS NULL)) AS pushable
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
    ), batched AS (
        -- One lease batch per stream pushed to: the first delivery of each of its messages,
        -- with no row of its own (ADR 0041).
        INSERT INTO outbox.lease_batches (consumer, leased_by, seqs, lease_expires_at, created_at)
        SELECT p.consumer, p.session, range_agg(int8range(p.seq, p.seq + 1)), p.until, relay_pass.at
          FROM planned p WHERE p.session IS NOT NULL
         GROUP BY p.consumer, p.session, p.until
        RETURNING *
    ), created AS (
        INSERT INTO outbox.deliveries AS d (message_id, consumer, seq, ordering_key, state, delivery_count,
                                            available_at, created_at, updated_at)
        SELECT p.message_id, p.consumer, p.seq, p.ordering_key, 'pending', 0, p.available_at, relay_pass.at, relay_pass.at
          FROM planned p WHERE p.session IS NULL
        ON CONFLICT ON CONSTRAINT deliveries_pkey DO NOTHING
        RETURNING d.*
    )
    SELECT (SELECT array_agg(ROW(d.*)::outbox.deliveries) FROM created d),
           (SELECT array_agg(ROW(b.*)::outbox.lease_batches) FROM batched b)
      INTO v_created, v_batches;

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
        SELECT 'd', d.consumer, NULL::text, NULL::timestamptz,
               m.message_id, m.seq, m.topic, m.type, NULL::bytea, m.headers,
               m.ordering_key, m.enqueued_at, m.available_at, relay_pass.at
          FROM unnest(v_created) d JOIN unnest(v_claimed) m ON m.message_id = d.message_id
        UNION ALL
        SELECT 'p', b.consumer, b.leased_by, b.lease_expires_at,
               m.message_id, m.seq, m.topic, m.type, m.payload, m.headers,
               m.ordering_key, m.enqueued_at, m.available_at, relay_pass.at
          FROM unnest(v_batches) b, unnest(b.seqs) r,
               LATERAL generate_series(lower(r), upper(r) - 1) s(seq)
               JOIN unnest(v_claimed) m ON m.seq = s.seq;
END
$$;

-- Every consumer's delivery of every message, whatever holds it: its row, else its lease batch
-- (leased, count 1), else its ack log entry (acked, count 1). For diagnosis and checks from
-- outside; it reads every batch and every ack log entry, so outboxd's own reads go to the
-- tables.
CREATE VIEW outbox.inbox AS
    SELECT d.message_id, d.consumer, d.seq, d.ordering_key, d.state, d.delivery_count, d.available_at,
           d.lease_expires_at, d.leased_by, d.last_error, d.created_at, d.updated_at, d.acked_at, d.dead_at
      FROM outbox.deliveries d
    UNION ALL
    SELECT m.message_id, b.consumer, m.seq, m.ordering_key, 'leased', 1, m.available_at,
           b.lease_expires_at, b.leased_by, NULL, b.created_at, b.created_at, NULL, NULL
      FROM outbox.lease_batches b, unnest(b.seqs) r,
           LATERAL (SELECT * FROM outbox.messages m WHERE m.seq >= lower(r) AND m.seq < upper(r) OFFSET 0) m
     WHERE NOT EXISTS (SELECT 1 FROM outbox.deliveries d WHERE d.message_id = m.message_id AND d.consumer = b.consumer)
    UNION ALL
    SELECT m.message_id, a.consumer, m.seq, m.ordering_key, 'acked', 1, m.available_at,
           NULL, NULL, NULL, a.at, a.at, a.at, NULL
      FROM outbox.ack_log a, unnest(a.seqs) r,
           LATERAL (SELECT * FROM outbox.messages m WHERE m.seq >= lower(r) AND m.seq < upper(r) OFFSET 0) m
     WHERE NOT EXISTS (SELECT 1 FROM outbox.deliveries d WHERE d.message_id = m.message_id AND d.consumer = a.consumer);
