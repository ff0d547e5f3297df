-- Another message under an existing message_id is still refused by every writer, but the
-- refusal no longer names which field differs: naming it let a producer that learned an id find
-- the stored message's topic, then its type, one guess at a time (PostgreSQL's
-- outbox.same_message says the same since functions revision 11).
DROP TRIGGER IF EXISTS outbox_messages_same_id_same_message;
CREATE TRIGGER outbox_messages_same_id_same_message BEFORE INSERT ON outbox_messages
WHEN NEW.message_id IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'outbox_messages: message_id exists already with a different topic, type or payload')
      FROM outbox_messages m
     WHERE m.message_id = NEW.message_id
       AND (m.topic IS NOT NEW.topic OR m.type IS NOT NEW.type OR m.payload IS NOT NEW.payload);
END;
