-- The transactional ack on outboxd's SQLite file, in the transaction of the effect: one row
-- changed is true, none is false, with the meaning of PostgreSQL's outbox.ack.
-- parameters: consumer, message_id, now
UPDATE outbox_deliveries SET state = 'acked', acked_at = ?3, updated_at = ?3,
       lease_expires_at = NULL, leased_by = NULL
 WHERE consumer = ?1 AND message_id = ?2 AND state IN ('leased', 'pending')
