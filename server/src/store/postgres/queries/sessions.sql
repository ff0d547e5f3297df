-- The web console's sessions (ADR 0073), by the SHA-256 of the cookie's random id.

-- name: console_session_insert
INSERT INTO outbox.console_sessions (id_hash, principal, token_hash, created_at, seen_at, expires_at)
VALUES ($1, $2, $3, $4, $4, $5);

-- name: console_session_find
SELECT principal, token_hash, created_at, seen_at, expires_at
  FROM outbox.console_sessions WHERE id_hash = $1;

-- name: console_session_touch
UPDATE outbox.console_sessions SET seen_at = $2 WHERE id_hash = $1 AND seen_at < $2;

-- name: console_session_delete
DELETE FROM outbox.console_sessions WHERE id_hash = $1;

-- name: console_session_delete_expired
DELETE FROM outbox.console_sessions WHERE expires_at <= $1 OR seen_at <= $2;

-- name: console_session_delete_oldest
-- A principal's oldest sessions beyond the newest `$2`: a sign-in loop cannot grow the table
-- without bound.
DELETE FROM outbox.console_sessions
 WHERE principal = $1
   AND id_hash NOT IN (SELECT id_hash FROM outbox.console_sessions
                        WHERE principal = $1 ORDER BY created_at DESC LIMIT $2);
