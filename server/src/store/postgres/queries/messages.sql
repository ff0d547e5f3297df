-- name: message_insert
SELECT id, message_seq, is_duplicate FROM outbox.enqueue_message($1, $2, $3, $4, $5, $6, $7 * interval '1 millisecond', $8);

-- name: message_page
SELECT message_id, seq, topic, ordering_key, available_at FROM outbox.messages
WHERE seq > $1 ORDER BY seq LIMIT $2;

-- name: message_unrelayed_summary
SELECT count(*) AS unrelayed, min(enqueued_at) AS oldest FROM outbox.unrelayed_messages;

-- name: message_search_bounds
SELECT CASE WHEN $1::timestamptz IS NULL THEN 0
     ELSE (SELECT seq FROM outbox.messages WHERE enqueued_at >= $1 ORDER BY enqueued_at, seq LIMIT 1) END,
CASE WHEN $2::timestamptz IS NULL THEN 9223372036854775807
     ELSE (SELECT seq + 1 FROM outbox.messages WHERE enqueued_at < $2
            ORDER BY enqueued_at DESC, seq DESC LIMIT 1) END;

-- name: message_unrelayed_exists
SELECT EXISTS (SELECT 1 FROM outbox.unrelayed_messages);

-- name: message_unrelayed_exists_asking_wakeup
SELECT EXISTS (SELECT 1 FROM outbox.unrelayed_messages),
setval('outbox.relay_wakeup', ceil(extract(epoch FROM clock_timestamp()) + $1)::bigint);

-- name: message_last_seq
SELECT coalesce(max(seq), 0) FROM outbox.messages;

-- name: message_seqs_of_ids
SELECT m.seq FROM outbox.messages m WHERE m.message_id = ANY($1);

-- name: message_find
SELECT {{message_columns}} FROM outbox.messages m WHERE m.message_id = $1;

-- name: message_list_after
SELECT {{message_columns}} FROM outbox.messages m WHERE m.seq > $1 ORDER BY m.seq LIMIT $2;

-- name: message_tail_window
-- Up to $2 messages with seq > $1, in seq order, as a tail matches them: seq, topic and size,
-- never the payload (`octet_length` of a bytea reads its stored length, not its bytes).
SELECT m.seq, m.topic,
       (octet_length(m.payload)::int8 + octet_length(m.headers::text) + octet_length(m.topic) + octet_length(m.type)
        + coalesce(octet_length(m.ordering_key), 0)) AS bytes
  FROM outbox.messages m WHERE m.seq > $1 ORDER BY m.seq LIMIT $2;

-- name: message_list_of_seqs
-- The messages of the seqs $1, in seq order.
SELECT {{message_columns}} FROM outbox.messages m WHERE m.seq = ANY ($1::int8[]) ORDER BY m.seq;

-- name: message_search_window
-- The matches in the window of the `$3` newest messages below `$1` and from `$2`, each with the
-- size and the lowest seq of the window. A topic is `$4` exactly, or matches the regular
-- expression `$10` of a topic pattern (`*` one segment, `>` the rest, as `outbox.topic_matches`
-- reads them, written out by the server so that no function is called per message).
WITH w AS ({{search_window}})
SELECT m.message_id, m.seq, m.topic, m.type, m.ordering_key, m.enqueued_at,
       (SELECT count(*) FROM w) AS scanned, (SELECT min(seq) FROM w) AS lowest
  FROM outbox.messages m
 WHERE m.seq IN (SELECT seq FROM w)
   AND ($4::text IS NULL OR m.topic = $4)
   AND ($10::text IS NULL OR m.topic ~ $10)
   AND ($5::text IS NULL OR m.type = $5)
   AND ($6::text IS NULL OR m.ordering_key = $6)
   AND ($7::timestamptz IS NULL OR m.enqueued_at >= $7)
   AND ($8::timestamptz IS NULL OR m.enqueued_at < $8)
 ORDER BY m.seq DESC LIMIT $9;

-- name: message_search_window_size
-- The size and the lowest seq of the window, when nothing in it matched.
SELECT count(*), min(seq) FROM ({{search_window}}) w;
