INSERT INTO v2.m (message_id, topic, type, payload) VALUES (gen_random_uuid(), 'orders.created', 'T', '\x7b7d');
