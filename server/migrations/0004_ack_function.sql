-- Transactional ack for consumers that share the database: called inside the transaction that
-- performs the effect, so effect and ack commit together or not at all. Returns false when the
-- delivery was already acked (or is dead, or unknown): the caller must roll back its effect.
CREATE FUNCTION outbox.ack(consumer text, message_id uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_rows bigint;
BEGIN
    UPDATE outbox.deliveries d
       SET state = 'acked', acked_at = now(), updated_at = now(),
           lease_expires_at = NULL, leased_by = NULL
     WHERE d.consumer = $1 AND d.message_id = $2 AND d.state IN ('leased', 'pending');
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows > 0;
END
$$;
