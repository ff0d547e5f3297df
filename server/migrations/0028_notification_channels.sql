-- outboxd's notification channels carry random keys that only outboxd's roles can read.
--
-- LISTEN/NOTIFY has no privileges: any login that may connect to the database can NOTIFY any
-- channel. On the fixed names `outbox_work` and `outbox_enqueued` it could wake every stream of
-- every replica (an empty payload means "every consumer") and keep the relay from sleeping, as
-- often as it liked. The channels are now `outbox_work_KEY` and `outbox_enqueued_WAKEKEY`
-- (ADR 0077): a login that cannot read these columns cannot name them (a session's LISTEN shows
-- in pg_stat_activity only to its own role and to pg_read_all_stats). Two keys: a producer's
-- insert sends on the wake-up channel from its own session, where it could see the name
-- (`trace_notify`), and the wake-up channel only wakes a relay, which a producer's insert may do
-- anyway; the work channel's key is used in outboxd's own sessions only. One pair per database,
-- shared by every replica; changing them takes a restart of every replica.
ALTER TABLE outbox.settings
    ADD COLUMN channel_key text NOT NULL DEFAULT replace(gen_random_uuid()::text, '-', '')
        CHECK (channel_key ~ '^[0-9a-f]{32}$'),
    ADD COLUMN wake_key text NOT NULL DEFAULT replace(gen_random_uuid()::text, '-', '')
        CHECK (wake_key ~ '^[0-9a-f]{32}$');
