-- revision: 12
-- The SQL functions of schema `outbox`, as they are now: the one place to read and change them.
--
-- Migrations (server/migrations) are history: they change tables, indexes and data, and are
-- never edited once released. The functions live here. `outboxd migrate` (and start-up with
-- migration on) applies this file after the migrations, in one transaction, when the database
-- holds an older revision, or this revision with another digest (`outbox.function_source`). So
-- a database at any migration ends with exactly these definitions, an unchanged file costs one
-- read, and an older release never puts its functions back over a newer one's (ADR 0043).
--
-- Rules for changing a function:
--  * the revision above grows by one with every release that changes this file, and
--    `FUNCTIONS_REVISION` in server/src/store/postgres/mod.rs with it;
--  * every statement here is CREATE OR REPLACE (or a GRANT): the file is applied again and again;
--  * a change of arguments or of the result type needs `DROP FUNCTION` in a new migration first
--    (CREATE OR REPLACE cannot change them), and the new definition here;
--  * a migration that moves data runs before this file, so it uses the functions of the release
--    before; it should not call functions at all.
-- Migrations 0003-0014 defined these functions before this file existed; from 0015 on, no
-- migration does (a test holds it).

-- ---- outbox.uuid_v7 ----
-- A time-ordered UUID (version 7), so ids sort roughly by enqueue time.
CREATE OR REPLACE FUNCTION outbox.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

-- ---- outbox.next_seq ----
-- A plain SQL expression, so that the planner inlines it into every insert: no function call.
-- Writers insert as the owner (outboxd's login, or `outbox.enqueue`, which runs with the
-- owner's rights); another login granted INSERT on the table also needs USAGE on the sequence.
CREATE OR REPLACE FUNCTION outbox.next_seq() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    -- The transaction id first (CASE evaluates its condition before its result).
    SELECT CASE WHEN pg_catalog.pg_current_xact_id() IS NOT NULL
                THEN pg_catalog.nextval('outbox.messages_seq'::pg_catalog.regclass) END
$$;

-- ---- outbox.topic_matches ----
-- Topic patterns as the server matches them: segments separated by dots, `*` one segment, `>`
-- (last) one or more. Topics and literal segments hold only [A-Za-z0-9_-], so the translation
-- to a regular expression needs no other escaping than the dots. A pattern without wildcards
-- matches by equality, with no regular expression: PostgreSQL keeps only 32 compiled ones per
-- backend, so with more consumers than that every relay pass compiled each pattern again
-- (most of a pass's cost with 30 consumers). A wildcard never equals a topic.
-- PL/pgSQL, not SQL: a SQL function with a subquery is never inlined, and PostgreSQL plans its
-- body again in every statement that calls it (0.1-0.3 ms of each relay pass); PL/pgSQL keeps
-- the plan for the connection (ADR 0047). The same holds for `multirange_slice` below.
CREATE OR REPLACE FUNCTION outbox.topic_matches(patterns text[], topic text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN topic = ANY (patterns) OR EXISTS (
        SELECT 1 FROM unnest(patterns) AS p
         WHERE strpos(p, '*') + strpos(p, '>') > 0
           AND topic ~ ('^' || replace(replace(replace(p, '.', '\.'), '*', '[^.]+'), '>', '.+') || '$'));
END
$$;

-- ---- outbox.seq_relayed ----
-- Whether the relay has read `seq`.
CREATE OR REPLACE FUNCTION outbox.seq_relayed(seq bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT seq <= (SELECT c.position FROM outbox.relay_cursor c)
       AND NOT EXISTS (SELECT 1 FROM outbox.relay_gaps g WHERE g.seqs @> seq)
$$;

-- ---- outbox.message_relayed_at ----
-- When a message was relayed (null while it waits for the relay).
CREATE OR REPLACE FUNCTION outbox.message_relayed_at(seq bigint, relayed_at timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN relayed_at IS NOT NULL THEN relayed_at
        WHEN outbox.seq_relayed(seq) THEN (SELECT l.at FROM outbox.relay_log l WHERE l.seqs @> seq LIMIT 1)
    END
$$;

-- ---- outbox.multirange_slice ----
-- The seqs of `m` ranked `skip + 1` to `skip + take` in order (all after `skip` when `take` is
-- null): how a lease or a push takes the lowest seqs of a range set, range by range.
CREATE OR REPLACE FUNCTION outbox.multirange_slice(m int8multirange, skip bigint, take bigint) RETURNS int8multirange
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN (SELECT coalesce(range_agg(int8range(lower(x.r) + greatest(skip - x.before, 0),
                                                least(upper(x.r), lower(x.r) + (skip + take - x.before)))),
                            '{}'::int8multirange)
              FROM (SELECT r, (sum(upper(r) - lower(r)) OVER (ORDER BY lower(r)))::bigint - (upper(r) - lower(r)) AS before
                      FROM unnest(m) r) x
             WHERE x.before + (upper(x.r) - lower(x.r)) > skip AND (take IS NULL OR x.before < skip + take));
END
$$;

-- ---- outbox.same_message ----
-- A message_id enqueued again is an idempotent success only for the same message: the same
-- topic, type and payload. Another message under an existing id is refused (SQLSTATE 23505,
-- unique_violation): a producer must not claim another topic's id, and a message must not be
-- dropped as a "duplicate" of one it is not. The refusal does not say which field differs: a
-- producer that learned an id could otherwise find the stored message's topic, then its type,
-- one guess at a time (docs/security.md says what a repeated id still reveals). Called by the
-- enqueue functions when their insert found the id taken.
CREATE OR REPLACE FUNCTION outbox.same_message(p_id uuid, p_topic text, p_type text, p_payload bytea)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF EXISTS (SELECT FROM outbox.messages m
                WHERE m.message_id = p_id
                  AND (m.topic <> p_topic OR m.type <> p_type OR m.payload <> p_payload)) THEN
        RAISE EXCEPTION 'outbox.enqueue: message_id % exists already with a different topic, type or payload', p_id
            USING ERRCODE = 'unique_violation',
                  HINT = 'A message_id names one message: enqueue another message under a new id.';
    END IF;
END
$$;

-- ---- outbox.enqueue_message ----
-- Inserts one message and reports whether it already existed. An existing message_id is an
-- idempotent success: nothing is written and the caller's transaction is not aborted.
CREATE OR REPLACE FUNCTION outbox.enqueue_message(
    topic        text,
    type         text,
    payload      bytea,
    headers      jsonb    DEFAULT '{}',
    message_id   uuid     DEFAULT NULL,
    ordering_key text     DEFAULT NULL,
    delay        interval DEFAULT NULL,
    -- The server passes its own clock here; SQL callers leave it to now().
    at           timestamptz DEFAULT NULL
) RETURNS TABLE (id uuid, message_seq bigint, is_duplicate boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
DECLARE
    v_id  uuid := coalesce(message_id, outbox.uuid_v7());
    v_seq bigint;
BEGIN
    IF topic IS NULL OR length(topic) > 255 OR topic !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' THEN
        RAISE EXCEPTION 'outbox.enqueue: invalid topic %: dot-separated segments of [A-Za-z0-9_-], at most 255 characters, required', quote_nullable(topic)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF type IS NULL OR type = '' THEN
        RAISE EXCEPTION 'outbox.enqueue: type must not be empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF payload IS NULL THEN
        RAISE EXCEPTION 'outbox.enqueue: payload must not be null'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'outbox.enqueue: headers must be a JSON object of strings'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF delay IS NOT NULL AND delay < interval '0' THEN
        RAISE EXCEPTION 'outbox.enqueue: delay must not be negative'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    INSERT INTO outbox.messages AS m (message_id, topic, type, payload, headers, ordering_key, enqueued_at, available_at)
    VALUES (v_id, topic, type, payload, coalesce(headers, '{}'), nullif(ordering_key, ''),
            coalesce(at, now()), coalesce(at, now()) + coalesce(delay, interval '0'))
    ON CONFLICT ON CONSTRAINT messages_message_id_key DO NOTHING
    RETURNING m.seq INTO v_seq;

    IF v_seq IS NOT NULL THEN
        RETURN QUERY SELECT v_id, v_seq, false;
    ELSE
        PERFORM outbox.same_message(v_id, topic, type, payload);
        RETURN QUERY SELECT m.message_id, m.seq, true FROM outbox.messages m WHERE m.message_id = v_id;
    END IF;
END
$$;

-- ---- outbox.enqueue ----
-- The producers' entry point: inserts one message in the caller's transaction, with the
-- owner's rights (a producer needs no privilege on the tables) and a pinned search_path. It
-- checks the limits of the Enqueue RPC (ADR 0023), naming the limit and the value, and inserts
-- the message itself rather than through `outbox.enqueue_message` (ADR 0040: a nested
-- PL/pgSQL call per message cost a fifth of its rate). The table's CHECKs still hold every
-- writer. `outbox.enqueue_message` serves outboxd's own Enqueue RPC (it takes a delay and a
-- time).
CREATE OR REPLACE FUNCTION outbox.enqueue(
    topic        text,
    type         text,
    payload      bytea,
    headers      jsonb DEFAULT '{}',
    message_id   uuid  DEFAULT NULL,
    ordering_key text  DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_key   text;
    v_value jsonb;
    v_count integer := 0;
    v_bytes integer := 0;
    v_id    uuid;
BEGIN
    IF topic IS NULL OR length(topic) > 255 OR topic !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' THEN
        RAISE EXCEPTION 'outbox.enqueue: invalid topic %: dot-separated segments of [A-Za-z0-9_-], at most 255 characters, required', quote_nullable(topic)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF type IS NULL OR type = '' THEN
        RAISE EXCEPTION 'outbox.enqueue: type must not be empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(type) > 255 THEN
        RAISE EXCEPTION 'outbox.enqueue: type is % bytes; the limit is 255 bytes', octet_length(type)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(ordering_key) > 255 THEN
        RAISE EXCEPTION 'outbox.enqueue: ordering_key is % bytes; the limit is 255 bytes', octet_length(ordering_key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF payload IS NULL THEN
        RAISE EXCEPTION 'outbox.enqueue: payload must not be null'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The Enqueue RPC's limit (--max-payload-bytes, written here by outboxd at start-up).
    v_count := (SELECT s.max_payload_bytes FROM outbox.settings s);
    IF octet_length(payload) > v_count THEN
        RAISE EXCEPTION 'outbox.enqueue: payload is % bytes; the limit is % bytes (outboxd''s --max-payload-bytes)',
                octet_length(payload), v_count
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_count := 0;
    IF headers IS NOT NULL AND headers <> '{}' THEN
        IF jsonb_typeof(headers) <> 'object' THEN
            RAISE EXCEPTION 'outbox.enqueue: headers must be a JSON object of strings'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        FOR v_key, v_value IN SELECT h.key, h.value FROM jsonb_each(headers) AS h LOOP
            v_count := v_count + 1;
            IF v_key = '' OR octet_length(v_key) > 256 THEN
                RAISE EXCEPTION 'outbox.enqueue: header key % is % bytes; keys are 1 to 256 bytes',
                        quote_literal(left(v_key, 32)), octet_length(v_key)
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF jsonb_typeof(v_value) <> 'string' THEN
                RAISE EXCEPTION 'outbox.enqueue: header % is a JSON %; header values are strings',
                        quote_literal(left(v_key, 32)), jsonb_typeof(v_value)
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            v_bytes := v_bytes + octet_length(v_key) + octet_length(v_value #>> '{}');
        END LOOP;
        IF v_count > 64 THEN
            RAISE EXCEPTION 'outbox.enqueue: % headers; the limit is 64 entries', v_count
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF v_bytes > 16384 THEN
            RAISE EXCEPTION 'outbox.enqueue: headers are % bytes (keys and values); the limit is 16384 bytes', v_bytes
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    -- An existing message_id is an idempotent success: nothing is written, the caller's
    -- transaction goes on, and the id is the answer (only a given id can conflict).
    INSERT INTO outbox.messages AS m (message_id, topic, type, payload, headers, ordering_key)
    VALUES (coalesce(message_id, outbox.uuid_v7()), topic, type, payload, coalesce(headers, '{}'),
            nullif(ordering_key, ''))
    ON CONFLICT ON CONSTRAINT messages_message_id_key DO NOTHING
    RETURNING m.message_id INTO v_id;
    IF v_id IS NULL THEN
        PERFORM outbox.same_message(message_id, topic, type, payload);
    END IF;
    RETURN coalesce(v_id, message_id);
END
$$;

-- ---- outbox.ack ----
-- The transactional ack: a consumer acks in the transaction of its effect. The answer is exact
-- (docs/sql-api.md):
--  * true: this call acked the delivery (a row that is leased or pending, or a first delivery
--    held in a leased range or waiting in a pending range);
--  * false: the delivery was acked already, or is dead (given up after `max_deliveries`: only a
--    replay delivers it again, and the ack of the replayed delivery then takes), or there is no
--    delivery of the message to this consumer (an unknown or pruned message or consumer, a topic
--    the consumer does not match, a message from before a consumer that starts from NEW, or a
--    message the relay has not read yet: its delivery comes later, and its ack then takes).
-- So false never leaves a delivery that can still be delivered without its effect: whatever
-- the consumer rolls back on false is either done already or still to come.
--
-- A first delivery's state is in a row of its own or in a range of `outbox.delivery_ranges`
-- (pending, leased or acked: ADR 0041, 0042, 0065). Relay passes, leases, stream acks,
-- releases and the sweeper move it between them, each in a transaction of its own, while this
-- runs in the consumer's (READ COMMITTED: every statement sees the commits before it). So the
-- decision reads the row and the ranges in ONE statement, one snapshot, in which each mover's
-- transaction is wholly visible or not at all; the write that follows is checked again on the
-- row it writes, and whatever a mover changed in between sends the call around the loop to
-- read again (ADR 0052). A first delivery held in a range gets an acked row of its own here, so
-- that the consumer's transaction never locks a range; the stream's own ack, a lease from a
-- pending range, the sweeper and the prune's fold later find the row and leave it alone (a row
-- decides over a range).
CREATE OR REPLACE FUNCTION outbox.ack(consumer text, message_id uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rows  bigint;
    v_seen  record;
BEGIN
    -- A login acks only for the consumers bound to it (outbox.consumer_logins), decided before
    -- anything about the message is read, so that a refusal says nothing of whether it exists.
    -- The schema's owner and superusers need no binding.
    IF session_user <> (SELECT n.nspowner::regrole::name FROM pg_namespace n WHERE n.nspname = 'outbox')
       AND NOT (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user)
       AND NOT EXISTS (SELECT 1 FROM outbox.consumer_logins b
                        WHERE b.login = session_user
                          AND $1 LIKE replace(replace(b.consumer, '_', '\_'), '*', '%')) THEN
        RAISE EXCEPTION 'outbox.ack: login % may not ack for consumer %', session_user, quote_literal($1)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Bind the login to the consumer: INSERT INTO outbox.consumer_logins (login, consumer) VALUES (...).';
    END IF;
    FOR v_round IN 1..100 LOOP
        -- A row of its own that is leased or pending: acked here, or waited for while another
        -- transaction holds it, and then decided on its newest version.
        UPDATE outbox.deliveries d
           SET state = 'acked', acked_at = now(), updated_at = now(), lease_expires_at = NULL, leased_by = NULL
         WHERE d.consumer = $1 AND d.message_id = $2 AND d.state IN ('leased', 'pending');
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows > 0 THEN
            RETURN true;
        END IF;
        -- The row and both kinds of range, in one snapshot. (An acked range need not be read: a
        -- seq in none of these is acked, dead, or not this consumer's delivery, and false is
        -- the answer for each.)
        SELECT (SELECT d.state FROM outbox.deliveries d WHERE d.consumer = $1 AND d.message_id = $2) AS row_state,
               EXISTS (SELECT 1 FROM outbox.delivery_ranges b
                        WHERE b.consumer = $1 AND b.state = 'leased' AND b.span @> m.seq AND b.seqs @> m.seq) AS leased,
               EXISTS (SELECT 1 FROM outbox.delivery_ranges p
                        WHERE p.consumer = $1 AND p.state = 'pending' AND p.span @> m.seq AND p.seqs @> m.seq) AS waiting
          INTO v_seen
          FROM outbox.messages m WHERE m.message_id = $2;
        IF NOT FOUND OR v_seen.row_state IN ('acked', 'dead')
           OR (v_seen.row_state IS NULL AND NOT v_seen.leased AND NOT v_seen.waiting) THEN
            RETURN false;
        ELSIF v_seen.row_state IS NOT NULL THEN
            -- Leased or pending in this snapshot, though the update above found it in no such
            -- state: a mover wrote the row meanwhile. Read again.
            CONTINUE;
        END IF;
        -- Held in a range: an acked row of its own. A row that a mover wrote meanwhile is acked
        -- instead if it is leased or pending; if it is acked or dead, nothing is written and
        -- the loop reads again, to answer from that row.
        INSERT INTO outbox.deliveries AS d (message_id, consumer, seq, ordering_key, state, delivery_count,
                                            available_at, created_at, updated_at, acked_at)
        SELECT m.message_id, $1, m.seq, m.ordering_key, 'acked',
               CASE WHEN v_seen.leased THEN 1 ELSE 0 END, m.available_at, now(), now(), now()
          FROM outbox.messages m WHERE m.message_id = $2
        ON CONFLICT ON CONSTRAINT deliveries_pkey DO UPDATE
           SET state = 'acked', acked_at = now(), updated_at = now(), lease_expires_at = NULL, leased_by = NULL
         WHERE d.state IN ('leased', 'pending');
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows > 0 THEN
            RETURN true;
        END IF;
    END LOOP;
    -- Only a delivery that movers keep changing under every one of a hundred reads gets here:
    -- a serialization failure, which the caller retries with its transaction, never a guess.
    RAISE EXCEPTION 'outbox.ack: the delivery of % to % kept changing while it was read; retry the transaction', $2, $1
        USING ERRCODE = 'serialization_failure';
END
$$;

-- ---- outbox.ack_seqs, outbox.ack_batch ----
-- A stream's acks in one call, by the messages' seqs as runs `[p_seq_lo[i], p_seq_hi[i])` (the
-- server knows the seq of every delivery it holds): rows that are leased or pending become
-- acked; the seqs are taken out of the consumer's leased ranges (emptied ranges go), and the
-- time of the ack of the range-held ones is logged (an acked range). A seq still in a pending
-- range (acked by a stream that was not sent it) leaves the range for an acked row of its own
-- with count 0. Returns how many deliveries changed.
--
-- The places are read in the order in which deliveries move between them: pending ranges,
-- then leased ranges, then rows (a lease moves a seq from a pending range to a leased range; a
-- release, the sweeper and a transactional ack move it from a range to a row). Each step locks
-- what it takes, waiting for a mover that holds it, and each later step is a later snapshot,
-- so a seq that a mover's commit takes out of one place is found in the next (ADR 0052). Read
-- the other way round, as before, a sweeper that turned an expired range's seq into a row
-- between the steps made the ack miss both: acked on the wire, then delivered again.
--
-- Rows are the exception (ADR 0041): they are found by one range scan of `(consumer, seq)` per
-- run, never by a look-up per acked message, which was most of a call of hundreds (ADR 0048).
CREATE OR REPLACE FUNCTION outbox.ack_seqs(p_consumer text, p_seq_lo bigint[], p_seq_hi bigint[], p_at timestamptz)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SET jit = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_rows    bigint;
    v_n       bigint;
    v_want    int8multirange;
    v_taken   int8multirange;
    v_emptied bigint[];
    v_own     int8multirange;
    v_pend    int8multirange;
    v_drained boolean;
BEGIN
    SELECT range_agg(int8range(r.lo, r.hi)) INTO v_want FROM unnest(p_seq_lo, p_seq_hi) AS r(lo, hi);
    IF v_want IS NULL OR isempty(v_want) THEN
        RETURN 0;
    END IF;
    -- 1. Pending ranges (only a stream that was not sent a delivery acks one of these).
    WITH held AS (
        SELECT p.id, p.seqs * v_want AS taken FROM outbox.delivery_ranges p
         WHERE p.consumer = p_consumer AND p.state = 'pending' AND p.span && range_merge(v_want) AND p.seqs && v_want
           FOR UPDATE
    ), moved AS (
        UPDATE outbox.delivery_ranges p SET seqs = p.seqs - h.taken FROM held h WHERE p.id = h.id AND p.state = 'pending'
        RETURNING h.taken, isempty(p.seqs) AS emptied
    )
    SELECT (SELECT range_agg(r) FROM moved, unnest(moved.taken) r), (SELECT bool_or(moved.emptied) FROM moved)
      INTO v_pend, v_drained;
    IF v_drained THEN
        DELETE FROM outbox.delivery_ranges p WHERE p.consumer = p_consumer AND p.state = 'pending' AND isempty(p.seqs);
    END IF;
    -- 2. Leased ranges: the first deliveries a stream was pushed or leased.
    WITH held AS (
        SELECT b.id, b.seqs * v_want AS taken FROM outbox.delivery_ranges b
         WHERE b.consumer = p_consumer AND b.state = 'leased' AND b.span && range_merge(v_want) AND b.seqs && v_want
           FOR UPDATE
    ), moved AS (
        UPDATE outbox.delivery_ranges b SET seqs = b.seqs - h.taken FROM held h WHERE b.id = h.id AND b.state = 'leased'
        RETURNING b.id, h.taken, isempty(b.seqs) AS emptied
    )
    SELECT (SELECT range_agg(r) FROM moved, unnest(moved.taken) r),
           (SELECT array_agg(moved.id) FROM moved WHERE moved.emptied)
      INTO v_taken, v_emptied;
    v_taken := coalesce(v_taken, '{}');
    IF v_emptied IS NOT NULL THEN
        DELETE FROM outbox.delivery_ranges b WHERE b.id = ANY (v_emptied) AND b.state = 'leased' AND isempty(b.seqs);
    END IF;
    -- 3. Rows: leased or pending ones become acked.
    UPDATE outbox.deliveries d
       SET state = 'acked', acked_at = p_at, updated_at = p_at, lease_expires_at = NULL, leased_by = NULL
     WHERE d.consumer = p_consumer AND d.seq > 0
       AND d.seq = ANY (ARRAY(SELECT x.seq FROM unnest(v_want) r,
                                     -- OFFSET 0: a range scan of the index per run.
                                     LATERAL (SELECT x.seq FROM outbox.deliveries x
                                               WHERE x.consumer = p_consumer
                                                 AND x.seq > 0 AND x.seq >= lower(r) AND x.seq < upper(r) OFFSET 0) x))
       AND d.state IN ('leased', 'pending');
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    IF isempty(v_taken) AND v_pend IS NULL THEN
        RETURN v_rows;
    END IF;
    v_own := coalesce((SELECT range_agg(int8range(x.seq, x.seq + 1)) FROM unnest(v_want) r,
                              LATERAL (SELECT x.seq FROM outbox.deliveries x
                                        WHERE x.consumer = p_consumer
                                          AND x.seq > 0 AND x.seq >= lower(r) AND x.seq < upper(r) OFFSET 0) x),
                      '{}'::int8multirange);
    -- A seq with a row of its own (a transactional ack got there first) was not the range's to
    -- ack: it leaves the range, but is neither logged nor counted.
    v_taken := v_taken - v_own;
    IF NOT isempty(v_taken) THEN
        INSERT INTO outbox.delivery_ranges (consumer, state, seqs, span, at)
        VALUES (p_consumer, 'acked', v_taken, range_merge(v_taken), p_at);
        v_rows := v_rows + (SELECT sum(upper(r) - lower(r)) FROM unnest(v_taken) r)::bigint;
    END IF;
    v_pend := coalesce(v_pend, '{}') - v_own;
    IF isempty(v_pend) THEN
        RETURN v_rows;
    END IF;
    INSERT INTO outbox.deliveries AS d (message_id, consumer, seq, ordering_key, state, delivery_count,
                                        available_at, created_at, updated_at, acked_at)
    SELECT m.message_id, p_consumer, m.seq, m.ordering_key, 'acked', 0, m.available_at, p_at, p_at, p_at
      FROM unnest(v_pend) r,
           LATERAL (SELECT * FROM outbox.messages m WHERE m.seq >= lower(r) AND m.seq < upper(r) OFFSET 0) m
    ON CONFLICT ON CONSTRAINT deliveries_pkey DO NOTHING;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_rows + v_n;
END
$$;

-- The same by `message_id` alone, for callers that do not know the seqs (a sink's runner, a
-- `relay --once`).
CREATE OR REPLACE FUNCTION outbox.ack_batch(p_consumer text, p_ids uuid[], p_at timestamptz) RETURNS bigint
LANGUAGE sql VOLATILE SET jit = off AS $$
    SELECT outbox.ack_seqs(p_consumer, coalesce(array_agg(m.seq), '{}'), coalesce(array_agg(m.seq + 1), '{}'), p_at)
      FROM outbox.messages m WHERE m.message_id = ANY (p_ids)
$$;

-- ---- outbox.unbatch ----
-- Turns range-held seqs into `leased` rows (count 1, the range's holder and deadline), for a
-- release or the sweeper to run on: the pairs `(p_consumers[i], p_ids[i])`, or with null
-- arrays every seq of every leased range whose deadline is at or before `p_expired_at`. Only ranges
-- held by `p_session` (when given) and expired by `p_expired_at` (when given) are touched.
-- Returns how many rows it wrote.
CREATE OR REPLACE FUNCTION outbox.unbatch(p_consumers text[], p_ids uuid[], p_session text, p_expired_at timestamptz)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SET jit = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_rows bigint;
BEGIN
    WITH want AS (
        SELECT w.consumer, range_agg(int8range(m.seq, m.seq + 1)) AS seqs
          FROM unnest(p_consumers, p_ids) AS w(consumer, message_id)
          JOIN outbox.messages m ON m.message_id = w.message_id
         GROUP BY w.consumer
    ), held AS (
        SELECT b.id, b.consumer, b.leased_by, b.lease_expires_at, b.at,
               CASE WHEN p_ids IS NULL THEN b.seqs ELSE b.seqs * w.seqs END AS taken
          FROM outbox.delivery_ranges b
          LEFT JOIN want w ON w.consumer = b.consumer
         WHERE b.state = 'leased' AND (p_ids IS NULL OR b.seqs && w.seqs)
           AND (p_session IS NULL OR b.leased_by = p_session)
           AND (p_expired_at IS NULL OR b.lease_expires_at <= p_expired_at)
           FOR UPDATE OF b
    ), moved AS (
        UPDATE outbox.delivery_ranges b SET seqs = b.seqs - h.taken FROM held h WHERE b.id = h.id AND b.state = 'leased'
        RETURNING h.*
    ), rows AS (
        INSERT INTO outbox.deliveries AS d (message_id, consumer, seq, ordering_key, state, delivery_count,
                                            available_at, lease_expires_at, leased_by, created_at, updated_at)
        SELECT m.message_id, h.consumer, m.seq, m.ordering_key, 'leased', 1, m.available_at,
               h.lease_expires_at, h.leased_by, h.at, h.at
          FROM moved h, unnest(h.taken) r,
               LATERAL (SELECT * FROM outbox.messages m WHERE m.seq >= lower(r) AND m.seq < upper(r) OFFSET 0) m
        -- A row of its own wins (a transactional ack got there first).
        ON CONFLICT ON CONSTRAINT deliveries_pkey DO NOTHING
        RETURNING 1
    )
    SELECT count(*) INTO v_rows FROM rows;
    DELETE FROM outbox.delivery_ranges b WHERE b.state = 'leased' AND isempty(b.seqs);
    RETURN v_rows;
END
$$;

-- ---- outbox.lease_pending_visible ----
-- Leases up to `p_limit` of the consumer's range-held pending deliveries to `p_session` until
-- `p_until`: the lowest seqs of its oldest pending ranges, moved into one leased range. Seqs
-- with a row of their own (a replay or a transactional ack got there first) leave the range
-- without being leased: the row decides them. Nothing is leased while the consumer is paused.
-- Only leases lock pending ranges, each for one short statement: a lease waits for another
-- on the same range instead of skipping it, so that no stream finds "nothing due" while a
-- backlog waits behind a lock.
--
-- Returns the leased seqs; the caller reads their messages in the same statement (LEASE_SQL in
-- the server), so that a lease copies each message once, straight to the client, instead of
-- through an array and a function's result set (ADR 0048). Seqs with a row of their own are
-- found by one range scan of `(consumer, seq)` per range, not by a look-up per message.
--
-- `p_visible`: the ids of the consumer's pending ranges that the caller's statement can see
-- (ADR 0056). Only those are taken. The function's own statements take newer snapshots than the
-- caller's, so a range that a relay pass committed after the caller's statement began is visible
-- here, while its messages are not to the caller's read of them: taken, its seqs would be leased
-- and never sent, stuck until the lease expired. NULL: every range.
CREATE OR REPLACE FUNCTION outbox.lease_pending_visible(p_consumer text, p_now timestamptz, p_limit integer,
                                                        p_until timestamptz, p_session text, p_visible bigint[])
RETURNS int8multirange
LANGUAGE plpgsql VOLATILE SET jit = off SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    v_need   bigint := p_limit;
    v_last   bigint := 0;
    v_id     bigint;
    v_seqs   int8multirange;
    v_part   int8multirange;
    v_taken  int8multirange := '{}';
BEGIN
    IF p_limit <= 0 OR NOT EXISTS (SELECT 1 FROM outbox.consumers c WHERE c.name = p_consumer AND NOT c.paused) THEN
        RETURN '{}';
    END IF;
    WHILE v_need > 0 LOOP
        SELECT b.id, b.seqs INTO v_id, v_seqs FROM outbox.delivery_ranges b
         WHERE b.consumer = p_consumer AND b.state = 'pending' AND b.id > v_last AND (p_visible IS NULL OR b.id = ANY (p_visible))
         ORDER BY b.id LIMIT 1
           FOR UPDATE;
        IF NOT FOUND THEN
            -- The row waited for was emptied by the lease that held it: look again.
            EXIT WHEN NOT EXISTS (SELECT 1 FROM outbox.delivery_ranges b
                                   WHERE b.consumer = p_consumer AND b.state = 'pending' AND b.id > v_last
                                     AND (p_visible IS NULL OR b.id = ANY (p_visible)));
            CONTINUE;
        END IF;
        v_last := v_id;
        v_part := outbox.multirange_slice(v_seqs, 0, v_need);
        IF isempty(v_part) THEN
            DELETE FROM outbox.delivery_ranges b WHERE b.id = v_id AND b.state = 'pending';
            CONTINUE;
        END IF;
        IF v_part = v_seqs THEN
            DELETE FROM outbox.delivery_ranges b WHERE b.id = v_id AND b.state = 'pending';
        ELSE
            UPDATE outbox.delivery_ranges b SET seqs = b.seqs - v_part WHERE b.id = v_id AND b.state = 'pending';
        END IF;
        v_taken := v_taken + v_part;
        v_need := v_need - (SELECT sum(upper(r) - lower(r)) FROM unnest(v_part) r)::bigint;
    END LOOP;
    IF isempty(v_taken) THEN
        RETURN v_taken;
    END IF;
    v_taken := v_taken - coalesce((SELECT range_agg(int8range(x.seq, x.seq + 1)) FROM unnest(v_taken) r,
                                          -- OFFSET 0: a range scan of the index per range.
                                          LATERAL (SELECT x.seq FROM outbox.deliveries x
                                                    WHERE x.consumer = p_consumer
                                                      AND x.seq > 0 AND x.seq >= lower(r) AND x.seq < upper(r) OFFSET 0) x),
                                  '{}'::int8multirange);
    IF NOT isempty(v_taken) THEN
        -- A seq whose message is gone (pruned) stays in the range until it expires; the
        -- sweeper's unbatch then finds no message for it and drops it.
        INSERT INTO outbox.delivery_ranges (consumer, state, seqs, span, leased_by, lease_expires_at, at)
        VALUES (p_consumer, 'leased', v_taken, range_merge(v_taken), p_session, p_until, p_now);
    END IF;
    RETURN v_taken;
END
$$;

-- ---- outbox.wake_relay ----
-- Wakes a relay that has backed off (ADR 0051): one `NOTIFY outbox_enqueued_KEY` from a statement
-- that inserts into `outbox.messages` while a relay's request holds (`outbox.relay_wakeup`: the
-- Unix time until which a relay that backed off asked for it, renewed while it sleeps, 0 again
-- from the next relay pass that finds work). The trigger's WHEN reads the request, so while none
-- holds, as whenever the relay is busy or no relay runs, the function is not even called: a
-- producer's statement pays one read of the sequence's buffer, and sends no notification (one
-- per commit would serialise producers' commits). Once per statement, however many rows it
-- inserts. KEY is `outbox.settings.wake_key` (migration 0028), which the inserting role cannot
-- read: so the function runs with its owner's rights, with `search_path` pinned, and only when
-- the trigger's WHEN found a request; with `trace_notify` off, so that the inserting session
-- cannot have the channel's name printed to it.
CREATE OR REPLACE FUNCTION outbox.wake_relay() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET trace_notify = off AS $$
BEGIN
    -- Not into a queue that a stuck listener (any login may LISTEN and idle in a transaction)
    -- has half filled: when it is full, every transaction that notifies fails at commit, this
    -- producer's included. The relay's fallback poll finds the message instead.
    IF pg_catalog.pg_notification_queue_usage() < 0.5 THEN
        PERFORM pg_catalog.pg_notify('outbox_enqueued_' || s.wake_key, '') FROM outbox.settings s;
    END IF;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER wake_relay BEFORE INSERT ON outbox.messages FOR EACH STATEMENT
    WHEN (pg_catalog.pg_sequence_last_value('outbox.relay_wakeup'::regclass)
          > pg_catalog.date_part('epoch', pg_catalog.statement_timestamp()))
    EXECUTE FUNCTION outbox.wake_relay();

-- ---- outbox.relay_claim ----
-- The read of a relay pass, in a transaction of its own that has not written yet (ADR 0067).
-- The rest of the pass (which consumer gets what, pushed or pending: `domain::fanout` in the
-- server) writes in the same transaction, with the named statements `relay_*`, and commits.
--  * takes the consumers lock shared (consumer changes take it exclusively), then the relays'
--    turn on the cursor (replays take it too), both until the transaction ends, so that a read of
--    the consumers after it (`outbox.relay_consumers_since`, with a snapshot of its own) sees every
--    consumer change and replay committed before;
--  * reads, in seq order and up to `batch`, the visible messages in open gaps and after the
--    cursor's position (ADR 0027); records the seq values it skipped below the highest one read
--    as a new gap; moves the position; logs what it relayed; closes the gaps whose holders have
--    all ended.
-- One function, one round trip: the gap rule needs the snapshot read before, and the
-- transaction id taken after, the read of the messages.
CREATE OR REPLACE FUNCTION outbox.relay_claim(batch integer, at timestamptz, lock_key bigint)
RETURNS SETOF outbox.messages
LANGUAGE plpgsql VOLATILE
SET jit = off
SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    v_position bigint;
    v_xmin     xid8;
    v_claimed  outbox.messages[];
    v_read     integer;
    v_read_to  bigint;
    v_found    int8multirange;
    v_missing  int8multirange;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(lock_key);
    -- Relays take turns on the cursor under an advisory lock, not the row's lock: a row lock
    -- would give this transaction its id now, and the gap rule needs an id taken after the read.
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'outbox.relay_claim must run in a transaction of its own (this one has written already)';
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
        -- Found work: a relay that asked to be woken is awake now (ADR 0051). After the read:
        -- setval gives this transaction its id.
        IF pg_sequence_last_value('outbox.relay_wakeup'::regclass) > 0 THEN
            PERFORM setval('outbox.relay_wakeup'::regclass, 0);
        END IF;
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
            UPDATE outbox.relay_cursor SET position = v_read_to, moved_at = relay_claim.at;
        END IF;
        INSERT INTO outbox.relay_log (seqs, at) VALUES (v_found, relay_claim.at);
    END IF;
    -- A read cut short by the batch may have left rows of a gap unread: close gaps only after a
    -- read that took everything visible.
    DELETE FROM outbox.relay_gaps g
     WHERE isempty(g.seqs) OR (v_read < batch AND g.open_until <= v_xmin);

    RETURN QUERY SELECT * FROM unnest(v_claimed);
END
$$;

-- ---- outbox.relay_consumers_since ----
-- The consumers a relay pass may fan out to (ADR 0078), as JSON:
--  * `version`: the consumers' version (migration 0029);
--  * `consumers`, only when `version` is not `known`, the version the caller holds them at:
--    every consumer as `[name, paused, start_seq, patterns]` (NULL patterns left out), which
--    the server keeps until the version moves;
--  * `backfill`: `[name, backfill_seq]` of the consumers whose `backfill_seq` reaches `first`,
--    the pass's first seq (an `EARLIEST` consumer's backfill, a replay's), which may have rows
--    for the pass's messages. Read every pass, so that replays, which raise it, do not move the
--    version and make the next pass read every consumer again.
-- The server matches the patterns (`domain::topic_matches`). Called after `outbox.relay_claim`
-- in the same statement, VOLATILE and PL/pgSQL so that its read takes a snapshot of its own,
-- after the claim took the consumers lock and the relays' turn (the statement's snapshot was
-- taken before the claim waited for them, and would miss a consumer created, or a replay's
-- `backfill_seq`, committed meanwhile): its one statement reads the version, the consumers and
-- the backfills in that snapshot.
CREATE OR REPLACE FUNCTION outbox.relay_consumers_since(known uuid, first bigint)
RETURNS json
LANGUAGE plpgsql VOLATILE
SET jit = off AS $$
BEGIN
    RETURN (SELECT json_build_object(
                       'version', v.version,
                       'consumers', CASE WHEN v.version IS DISTINCT FROM known THEN
                           (SELECT coalesce(json_agg(json_build_array(s.name, s.paused, s.start_seq,
                                                                      array_remove(s.topics, NULL))), '[]')
                              FROM outbox.consumers s) END,
                       'backfill', (SELECT coalesce(json_agg(json_build_array(s.name, s.backfill_seq)), '[]')
                                      FROM outbox.consumers s WHERE s.backfill_seq >= first))
              FROM outbox.consumers_version v);
END
$$;

-- ---- outbox.consumers_changed ----
-- Gives the consumers a new version (migration 0029) in the writer's transaction, whoever
-- writes: on every consumer created or deleted, and on an update of what a relay pass keeps
-- (name, topics, paused, start), not of `backfill_seq`, which passes read every time. The
-- triggers fire in every `session_replication_role` (ENABLE ALWAYS), so that logical
-- replication's apply moves the version too.
CREATE OR REPLACE FUNCTION outbox.consumers_changed() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE outbox.consumers_version SET version = gen_random_uuid();
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER consumers_changed AFTER INSERT OR DELETE ON outbox.consumers
    FOR EACH ROW EXECUTE FUNCTION outbox.consumers_changed();
CREATE OR REPLACE TRIGGER consumers_updated AFTER UPDATE ON outbox.consumers FOR EACH ROW
    WHEN ((OLD.name, OLD.topics, OLD.paused, OLD.start_seq) IS DISTINCT FROM
          (NEW.name, NEW.topics, NEW.paused, NEW.start_seq))
    EXECUTE FUNCTION outbox.consumers_changed();
CREATE OR REPLACE TRIGGER consumers_truncated AFTER TRUNCATE ON outbox.consumers
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.consumers_changed();
-- Idempotent, like every statement here.
ALTER TABLE outbox.consumers ENABLE ALWAYS TRIGGER consumers_changed;
ALTER TABLE outbox.consumers ENABLE ALWAYS TRIGGER consumers_updated;
ALTER TABLE outbox.consumers ENABLE ALWAYS TRIGGER consumers_truncated;

-- ---- privileges ----
-- Nothing in schema outbox is callable by everyone; each role gets what it needs. The owner,
-- outboxd's own login, keeps every privilege. Migration 0009's per-schema default privileges do
-- not override the global default (EXECUTE to PUBLIC on every new function), so every function
-- is revoked from PUBLIC here, explicitly, each time this file is applied.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'outbox'::regnamespace LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- An INSERT's default for `seq` (any role granted INSERT on the table also needs it).
GRANT EXECUTE ON FUNCTION outbox.next_seq() TO PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, bytea, jsonb, uuid, text) TO outbox_producer;
GRANT EXECUTE ON FUNCTION outbox.ack(text, uuid) TO outbox_consumer;
