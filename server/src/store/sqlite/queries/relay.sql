-- name: message_mark_relayed
UPDATE outbox_messages SET relayed_at = ?2
 WHERE seq IN (SELECT seq FROM outbox_messages WHERE relayed_at IS NULL AND seq >= ?3
                ORDER BY seq LIMIT ?1)
RETURNING message_id, seq, topic, type, payload, headers, ordering_key, enqueued_at,
          coalesce(available_at, enqueued_at) AS available_at, relayed_at;
