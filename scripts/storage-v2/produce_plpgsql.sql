SELECT v2.enqueue_plpgsql('orders.created', 'T', '\x7b7d');
