-- ADR 0074: a release that was no attempt (a clean close, a shutdown, a delivery never sent)
-- gives back the count its lease took, so that delivery_count never passes max_deliveries.
-- Releases before it kept that count: a delivery released so on its last attempt waits pending at
-- max_deliveries or above, and its next lease would count past the bound. It gets back the one
-- attempt that release took from it; any other delivery counted above the bound is brought down
-- to it. Only rows carry counts above 1: a range-held delivery counts 0 or 1.
UPDATE outbox.deliveries d
   SET delivery_count = CASE WHEN d.state = 'pending' THEN c.max_deliveries - 1 ELSE c.max_deliveries END
  FROM outbox.consumers c
 WHERE c.name = d.consumer
   AND (d.delivery_count > c.max_deliveries
        OR (d.state = 'pending' AND d.delivery_count >= c.max_deliveries));
