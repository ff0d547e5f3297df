-- The topic grammar (contract/topics.json, ADR 0084) as outboxd, every client and PostgreSQL hold
-- it: at most 255 characters, and no NUL, which SQLite's GLOB checks of 0003 and 0008 stop at
-- (so `orders` followed by a NUL and anything passed them). Both are measured in bytes.
CREATE TRIGGER outbox_messages_topic_grammar BEFORE INSERT ON outbox_messages
WHEN length(CAST(NEW.topic AS BLOB)) > 255 OR instr(CAST(NEW.topic AS BLOB), x'00') > 0
BEGIN
    SELECT RAISE(ABORT, 'outbox_messages: topic must be dot-separated segments of [A-Za-z0-9_-] (orders.created), at most 255 characters');
END;
