-- A relay that has nothing to do asks producers' commits to wake it (ADR 0051).
--
-- The relay polls, backing off to `--relay-poll-max` while the outbox is quiet: a NOTIFY on
-- every producer's commit would serialise their commits on PostgreSQL's notification queue. So a
-- message committed after a quiet spell waited for the next poll (up to that maximum) unless it
-- came through outboxd's own `Enqueue`.
--
-- This sequence holds the request: the Unix time (seconds) until which a relay that backed off
-- wants producers' inserts to wake it; 0 (or never set) for none. A relay sets it as it backs off
-- and renews it while it sleeps; the first relay pass that finds work sets it back to 0; a relay
-- that died stops renewing it and it lapses. `setval` is not transactional, so each change takes
-- effect at once. A statement trigger on `outbox.messages` (server/sql/functions.sql) reads it
-- in its WHEN clause and sends one `NOTIFY outbox_enqueued` only while it holds. A sequence
-- because its value can be read without a subquery, which a trigger's WHEN cannot hold: while no
-- request holds, as whenever the relay is busy, a producer's statement reads one buffer and calls
-- nothing.
CREATE SEQUENCE outbox.relay_wakeup MINVALUE 0 START 0 NO CYCLE;
-- Every producer's insert reads it, whatever role it inserts as. It says only whether a relay is
-- asleep.
GRANT SELECT ON SEQUENCE outbox.relay_wakeup TO PUBLIC;
