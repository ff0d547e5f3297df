SELECT v2.enqueue_sql('orders.created', 'T', '\x7b7d');
