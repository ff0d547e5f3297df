-- name: relay_pass
SELECT * FROM outbox.relay_pass($1, $2, $3, $4, $5, $6, $7, $8, $9);
