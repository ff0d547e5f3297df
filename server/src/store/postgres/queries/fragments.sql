-- Pieces of SQL that several statements share, included as {{name}}.

-- fragment: message_columns
-- A message as `message_from_row` reads it.
m.message_id, m.seq, m.topic, m.type, m.payload, m.headers, m.ordering_key, m.enqueued_at, m.available_at,
outbox.message_relayed_at(m.seq, m.relayed_at) AS relayed_at

-- fragment: message_columns_without_bodies
-- A message as `message_from_row` reads it, with an empty payload and no headers.
m.message_id, m.seq, m.topic, m.type, ''::bytea AS payload, '{}'::jsonb AS headers, m.ordering_key, m.enqueued_at,
m.available_at, outbox.message_relayed_at(m.seq, m.relayed_at) AS relayed_at

-- fragment: function_source_digest
-- The digest of the functions' source, bound as $1.
encode(sha256(convert_to($1, 'UTF8')), 'hex')

-- fragment: search_window
-- The `$3` newest seqs below `$1` and from `$2`, by primary key.
SELECT m.seq FROM outbox.messages m WHERE m.seq < $1 AND m.seq >= $2 ORDER BY m.seq DESC LIMIT $3

-- fragment: replay_filters
-- A replay's filters: messages $3 (any when empty), enqueued from $4 and before $5 (either
-- bound open when NULL), types $6 (any when empty), last error $7 (any when NULL).
AND (cardinality($3::uuid[]) = 0 OR m.message_id = ANY($3))
AND ($4::timestamptz IS NULL OR m.enqueued_at >= $4)
AND ($5::timestamptz IS NULL OR m.enqueued_at < $5)
AND (cardinality($6::text[]) = 0 OR m.type = ANY($6))
AND ($7::text IS NULL OR d.last_error = $7)
