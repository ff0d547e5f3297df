-- name: synchronous_normal
PRAGMA synchronous = NORMAL;

-- name: rollback
ROLLBACK;

-- name: synchronous_full
PRAGMA synchronous = FULL;

-- name: commit
COMMIT;

-- name: begin_immediate
BEGIN IMMEDIATE;

-- name: optimize
PRAGMA optimize;

-- name: settings_write
UPDATE outbox_settings SET max_payload_bytes = ?1 WHERE max_payload_bytes <> ?1;

-- name: data_version
PRAGMA data_version;
