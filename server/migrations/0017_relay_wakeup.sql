-- A relay that has nothing to do asks producers' commits to wake it (ADR 0051).
--
-- The relay polls, backing off to `--relay-poll-max` while the outbox is quiet: a NOTIFY on
-- every producer's commit would serialise their commits on PostgreSQL's notification queue. So a
-- message committed after a quiet spell waited for the next poll (up to that maximum) unless it
-- came through outboxd's own `Enqueue`.
--
-- This sequence is the request, used as a flag: 1 while a relay that backed off wants to be
-- woken (`setval` by the relay as it backs off, and back to 0 by the first relay pass that finds
-- work; `setval` is not transactional, so both take effect at once). A statement trigger on
-- `outbox.messages` (server/sql/functions.sql) reads it in its WHEN clause and sends one
-- `NOTIFY outbox_enqueued` only while it is 1. A sequence because its value can be read
-- without a subquery, which a trigger's WHEN cannot hold: while the flag is 0, as it is whenever
-- the relay is busy, a producer's statement reads one buffer and calls nothing.
CREATE SEQUENCE outbox.relay_wakeup MINVALUE 0 MAXVALUE 1 START 0 NO CYCLE;
-- Every producer's insert reads the flag, whatever role it inserts as. It says only whether a
-- relay is asleep.
GRANT SELECT ON SEQUENCE outbox.relay_wakeup TO PUBLIC;
