-- A message_id enqueued again is an idempotent success only for the same message (the same
-- topic, type and payload); another message under an existing id is refused, by every writer,
-- naming the first field that differs (PostgreSQL: outbox.same_message, SQLSTATE 23505). A
-- BEFORE trigger fires before ON CONFLICT decides, so the documented insert and its
-- `ON CONFLICT (message_id) DO NOTHING` keep working for true duplicates.
CREATE TRIGGER outbox_messages_same_id_same_message BEFORE INSERT ON outbox_messages
WHEN NEW.message_id IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'outbox_messages: message_id exists already with a different topic')
      FROM outbox_messages m WHERE m.message_id = NEW.message_id AND m.topic IS NOT NEW.topic;
    SELECT RAISE(ABORT, 'outbox_messages: message_id exists already with a different type')
      FROM outbox_messages m WHERE m.message_id = NEW.message_id AND m.type IS NOT NEW.type;
    SELECT RAISE(ABORT, 'outbox_messages: message_id exists already with a different payload')
      FROM outbox_messages m WHERE m.message_id = NEW.message_id AND m.payload IS NOT NEW.payload;
END;
