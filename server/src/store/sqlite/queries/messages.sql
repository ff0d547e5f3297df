-- name: message_insert
INSERT INTO outbox_messages (message_id, topic, type, payload, headers, ordering_key, enqueued_at, available_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (message_id) DO NOTHING
RETURNING seq;

-- name: message_seq_of_id
SELECT seq FROM outbox_messages WHERE message_id = ?1;

-- name: message_page
SELECT message_id, seq, topic, ordering_key, coalesce(available_at, enqueued_at) AS available_at
FROM outbox_messages WHERE seq > ?1 ORDER BY seq LIMIT ?2;

-- name: message_unrelayed_summary
SELECT count(*) AS unrelayed, min(enqueued_at) AS oldest FROM outbox_messages
 WHERE seq > (SELECT c.position FROM outbox_relay_cursor c WHERE c.id = 1);

-- name: message_enqueued_at
SELECT enqueued_at FROM outbox_messages WHERE seq = ?1;

-- name: message_unrelayed_exists
SELECT EXISTS (SELECT 1 FROM outbox_messages WHERE seq > (SELECT c.position FROM outbox_relay_cursor c WHERE c.id = 1));

-- name: message_last_seq
SELECT coalesce(max(seq), 0) FROM outbox_messages;

-- name: message_search_bounds
SELECT CASE WHEN ?1 IS NULL THEN 0
     ELSE (SELECT seq FROM outbox_messages WHERE enqueued_at >= ?1 ORDER BY enqueued_at, seq LIMIT 1) END,
CASE WHEN ?2 IS NULL THEN 9223372036854775807
     ELSE (SELECT seq + 1 FROM outbox_messages WHERE enqueued_at < ?2
            ORDER BY enqueued_at DESC, seq DESC LIMIT 1) END;

-- name: message_find
SELECT {{message_columns}} FROM outbox_messages m WHERE m.message_id = ?1;

-- name: message_list_after
SELECT {{message_columns}} FROM outbox_messages m WHERE m.seq > ?1 ORDER BY m.seq LIMIT ?2;

-- name: message_tail_window
-- Up to ?2 messages with seq > ?1, in seq order, as a tail matches them: seq, topic and size,
-- never the payload (`length` of a blob reads its stored length, not its bytes).
SELECT m.seq, m.topic,
       length(m.payload) + length(CAST(m.headers AS BLOB)) + length(CAST(m.topic AS BLOB))
       + length(CAST(m.type AS BLOB)) + coalesce(length(CAST(m.ordering_key AS BLOB)), 0) AS bytes
  FROM outbox_messages m WHERE m.seq > ?1 ORDER BY m.seq LIMIT ?2;

-- name: message_list_of_seqs
-- The messages of the seqs in the JSON array ?1, in seq order.
SELECT {{message_columns}} FROM outbox_messages m
 WHERE m.seq IN (SELECT value FROM json_each(?1)) ORDER BY m.seq;

-- name: message_list_of_ids
-- The messages whose ids the JSON array ?1 holds, in seq order.
SELECT {{message_columns}} FROM outbox_messages m
 WHERE m.message_id IN (SELECT value FROM json_each(?1)) ORDER BY m.seq;

-- name: message_search_window_size
-- The size and the lowest seq of the window of the `?3` newest messages below `?1` and from `?2`.
SELECT count(*), min(seq) FROM ({{search_window}});

-- name: message_search_window
-- The matches in that window. A topic is ?4 exactly, or matches the GLOB ?10 that a topic
-- pattern makes (each `*` or `>` segment a `*`: more than the pattern matches, which the
-- server then narrows to the pattern's own matches).
SELECT m.message_id, m.seq, m.topic, m.type, m.ordering_key, m.enqueued_at
  FROM outbox_messages m
 WHERE m.seq IN ({{search_window}})
   AND (?4 IS NULL OR m.topic = ?4) AND (?10 IS NULL OR m.topic GLOB ?10) AND (?5 IS NULL OR m.type = ?5)
   AND (?6 IS NULL OR m.ordering_key = ?6)
   AND (?7 IS NULL OR m.enqueued_at >= ?7) AND (?8 IS NULL OR m.enqueued_at < ?8)
 ORDER BY m.seq DESC LIMIT ?9;
