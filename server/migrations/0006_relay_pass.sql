-- A relay pass in one round trip: claim, fan out (pushing to streams that have room), notify.

-- Topic patterns as the server matches them: segments separated by dots, `*` one segment, `>`
-- (last) one or more. Topics and literal segments hold only [A-Za-z0-9_-], so the translation
-- to a regular expression needs no other escaping than the dots.
CREATE FUNCTION outbox.topic_matches(patterns text[], topic text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT EXISTS (
        SELECT 1 FROM unnest(patterns) AS p
         WHERE topic ~ ('^' || replace(replace(replace(p, '.', '\.'), '*', '[^.]+'), '>', '.+') || '$'))
$$;

-- One relay pass, in the caller's transaction (autocommit: one round trip):
--  * takes the consumers lock shared (consumer changes take it exclusively), so that the fan-out
--    below, a later statement with a later snapshot, sees every consumer created before;
--  * claims up to `batch` unrelayed messages in seq order from `from_seq` on (skipping rows other
--    passes hold). The caller passes the seq after its last claim, so that the scan starts past
--    the index entries of relayed rows that vacuum has not removed yet, and 0 now and then, for
--    a message whose transaction committed after later ones were relayed;
--  * creates one delivery per matching consumer (seq > start_seq). A delivery that can go at
--    once (due, no ordering key, consumer not paused) is created leased to a stream of the
--    calling process, as far as the room offered allows: `push_*` are parallel arrays of
--    (consumer, session, room, lease deadline), filled in array order;
--  * notifies `notify` (when not null) once, naming the consumers that got pending deliveries.
-- Returns one row per claimed message (kind 'm') and one per delivery created: 'p' (pushed,
-- with the payload) or 'd' (pending).
CREATE FUNCTION outbox.relay_pass(
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
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_claimed outbox.messages[];
    v_created outbox.deliveries[];
    v_woken   text;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(lock_key);
    WITH claimed AS (
        UPDATE outbox.messages m SET relayed_at = relay_pass.at
         WHERE m.seq IN (SELECT u.seq FROM outbox.messages u
                          WHERE u.relayed_at IS NULL AND u.seq >= relay_pass.from_seq
                          ORDER BY u.seq LIMIT relay_pass.batch FOR UPDATE SKIP LOCKED)
        RETURNING m.*
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
    SELECT (SELECT array_agg(ROW(c.*)::outbox.messages) FROM claimed c),
           (SELECT array_agg(ROW(d.*)::outbox.deliveries) FROM created d)
      INTO v_claimed, v_created;

    IF v_claimed IS NULL THEN
        RETURN;
    END IF;
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
               m.ordering_key, m.enqueued_at, m.available_at, m.relayed_at
          FROM unnest(v_claimed) m
        UNION ALL
        SELECT CASE WHEN d.state = 'leased' THEN 'p' ELSE 'd' END, d.consumer, d.leased_by, d.lease_expires_at,
               m.message_id, m.seq, m.topic, m.type, CASE WHEN d.state = 'leased' THEN m.payload END, m.headers,
               m.ordering_key, m.enqueued_at, m.available_at, m.relayed_at
          FROM unnest(v_created) d JOIN unnest(v_claimed) m ON m.message_id = d.message_id;
END
$$;
