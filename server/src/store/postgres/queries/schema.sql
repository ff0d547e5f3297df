-- name: function_source_lock
LOCK TABLE outbox.function_source IN EXCLUSIVE MODE;

-- name: tables_analyze
ANALYZE outbox.messages, outbox.deliveries, outbox.consumers, outbox.relay_gaps, outbox.relay_log, outbox.delivery_ranges;

-- name: connection_tls
-- The TLS version of this session as the server sees it, NULL when it is not encrypted.
SELECT CASE WHEN ssl THEN version END FROM pg_stat_ssl WHERE pid = pg_backend_pid();

-- name: settings_channel_keys
-- The keys of this database's notification channels (migration 0028).
SELECT channel_key, wake_key FROM outbox.settings;

-- name: settings_write
UPDATE outbox.settings SET max_payload_bytes = $1 WHERE max_payload_bytes <> $1;

-- name: function_source_held
-- The revision of the functions the database holds, and whether their digest is that of $1.
SELECT revision, digest = {{function_source_digest}} FROM outbox.function_source;

-- name: function_source_record
-- Records revision $2 of the functions whose source is $1.
INSERT INTO outbox.function_source (id, revision, digest, applied_at) VALUES (true, $2, {{function_source_digest}}, now())
ON CONFLICT (id) DO UPDATE
   SET revision = excluded.revision, digest = excluded.digest, applied_at = excluded.applied_at;
