//! The transitions of the delivery state machine, T1 to T27: one [`Transition`] each, with the
//! states it leaves and enters, its cause, and what makes it on each store.
//!
//! This is the one statement of the machine: the transitions table of
//! `docs/delivery-states.md` is rendered from it ([`Transition::table`]), and a test fails with
//! the difference when the page says anything else (`OUTBOXD_WRITE_DOCS=1 cargo test -p
//! outbox-server --lib domain::transition` writes the table back). The page's diagram is checked
//! against it too, and `store::transition_tests` runs a case per transition on both stores and
//! checks that it has one for each of [`Transition::ALL`].
use std::fmt::{self, Write as _};

use super::DeliveryState;

/// Where a delivery is, as the state machine's diagram draws it: one of the four stored states,
/// or one of the three conditions around them that a transition leaves or enters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The consumer has no delivery of the message (yet).
    NoDelivery,
    /// A delivery in one of the four stored states; [`DeliveryState::Dead`] here holds no key.
    Is(DeliveryState),
    /// A dead letter of a consumer with `dead_key_policy = 'hold'` that holds its ordering key
    /// (an `outbox.held_keys` row): its key's later deliveries wait.
    DeadHoldingKey,
    /// No more: pruned with its message, or deleted with its consumer.
    Gone,
}

const NO_DELIVERY: Stage = Stage::NoDelivery;
const PENDING: Stage = Stage::Is(DeliveryState::Pending);
const LEASED: Stage = Stage::Is(DeliveryState::Leased);
const ACKED: Stage = Stage::Is(DeliveryState::Acked);
const DEAD: Stage = Stage::Is(DeliveryState::Dead);
const DEAD_HOLDING_KEY: Stage = Stage::DeadHoldingKey;
const GONE: Stage = Stage::Gone;
/// Every stage a delivery exists in.
const ANY: &[Stage] = &[PENDING, LEASED, ACKED, DEAD, DEAD_HOLDING_KEY];

impl Stage {
    /// Every stage, in the diagram's order.
    pub const ALL: [Stage; 7] = [NO_DELIVERY, PENDING, LEASED, ACKED, DEAD, DEAD_HOLDING_KEY, GONE];

    /// The node that stands for this stage in the page's mermaid diagram.
    pub fn diagram_node(self) -> &'static str {
        match self {
            Stage::NoDelivery => "nodelivery",
            Stage::Is(s) => s.as_str(),
            Stage::DeadHoldingKey => "dead_holding",
            Stage::Gone => "[*]",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stage::NoDelivery => f.write_str("no delivery"),
            Stage::Is(s) => write!(f, "`{}`", s.as_str()),
            Stage::DeadHoldingKey => f.write_str("`dead` holding its key"),
            Stage::Gone => f.write_str("gone"),
        }
    }
}

/// One transition of the delivery state machine; `T8` is the page's T8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Transition {
    T1 = 1,
    T2,
    T3,
    T4,
    T5,
    T6,
    T7,
    T8,
    T9,
    T10,
    T11,
    T12,
    T13,
    T14,
    T15,
    T16,
    T17,
    T18,
    T19,
    T20,
    T21,
    T22,
    T23,
    T24,
    T25,
    T26,
    T27,
}

impl Transition {
    /// Every transition, in order.
    pub const ALL: [Transition; 27] = {
        let mut all = [Transition::T1; 27];
        let mut i = 0;
        while i < 27 {
            all[i] = ROWS[i].transition;
            i += 1;
        }
        all
    };

    /// Its number: 8 for T8.
    pub fn number(self) -> u8 {
        self as u8
    }

    fn row(self) -> &'static Row {
        &ROWS[self as usize - 1]
    }

    /// The stages it leaves: one, but for a replay of a dead letter (holding its key or not) and
    /// a consumer's deletion (every stage a delivery exists in).
    pub fn from(self) -> &'static [Stage] {
        self.row().from
    }

    /// The stage it enters.
    pub fn to(self) -> Stage {
        self.row().to
    }

    /// What the two stages do not say: the count, when it is due, what is kept or cleared.
    pub fn detail(self) -> &'static str {
        self.row().detail
    }

    /// What makes it happen.
    pub fn cause(self) -> &'static str {
        self.row().cause
    }

    /// The statements and functions that make it on PostgreSQL.
    pub fn postgres(self) -> &'static str {
        self.row().postgres
    }

    /// The statements and functions that make it on SQLite.
    pub fn sqlite(self) -> &'static str {
        self.row().sqlite
    }

    /// The transition as the page's table says it: `` `leased` → `pending` (due now) ``.
    pub fn arrow(self) -> String {
        let from = if self.from() == ANY {
            "any".to_owned()
        } else {
            self.from().iter().map(Stage::to_string).collect::<Vec<_>>().join(" or ")
        };
        format!("{from} → {}{}", self.to(), self.detail())
    }

    /// The transitions table of `docs/delivery-states.md`, a line per transition.
    pub fn table() -> String {
        let mut table = String::from("| # | transition | cause | PostgreSQL | SQLite |\n|---|---|---|---|---|\n");
        for t in Transition::ALL {
            let _ = writeln!(table, "| {t} | {} | {} | {} | {} |", t.arrow(), t.cause(), t.postgres(), t.sqlite());
        }
        table
    }
}

impl fmt::Display for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "T{}", self.number())
    }
}

/// A line of the table, in [`ROWS`] at its transition's number less one.
struct Row {
    transition: Transition,
    from: &'static [Stage],
    to: Stage,
    detail: &'static str,
    cause: &'static str,
    postgres: &'static str,
    sqlite: &'static str,
}

const ROWS: [Row; 27] = [
    Row {
        transition: Transition::T1,
        from: &[NO_DELIVERY],
        to: LEASED,
        detail: " (count 1)",
        cause: "relay pass: an unkeyed, due message for a consumer that is not paused, with a stream of this process \
               offering room (ADR 0012, 0044)",
        postgres: "the pass (`store::relay_pass`, both stores) asks `domain::fanout::plan` (the policy, both \
                  stores), which gives each offer the lowest seqs of its consumer's share; its `relay_write`, \
                  `relay_insert_ranges`: one `INSERT INTO outbox.delivery_ranges … 'leased'` (a leased range) per \
                  stream pushed to, in the pass's transaction after `outbox.relay_claim`",
        sqlite: "the pass and `fanout::plan`, then `relay_write` → `delivery_insert_many_returning`: `INSERT INTO \
                outbox_deliveries … 'leased', 1 … ON CONFLICT DO NOTHING` (a conflicting row is neither pushed nor \
                counted)",
    },
    Row {
        transition: Transition::T2,
        from: &[NO_DELIVERY],
        to: PENDING,
        detail: " (count 0, due)",
        cause: "relay pass: an unkeyed, due message not pushed (no stream, no room, consumer paused)",
        postgres: "`fanout::plan`'s `pending`; `relay_insert_ranges`: one `INSERT INTO outbox.delivery_ranges … \
                  'pending'` (a pending range) per consumer (with `notify`, `relay_notify`: one `NOTIFY \
                  outbox_work_KEY` naming the consumers)",
        sqlite: "`delivery_insert_many_returning`, row `'pending', 0`",
    },
    Row {
        transition: Transition::T3,
        from: &[NO_DELIVERY],
        to: PENDING,
        detail: " row",
        cause: "relay pass: a keyed message, or a delayed one (`available_at > greatest(at, enqueued_at)`), whatever \
               the room and the pause",
        postgres: "`fanout::plan`'s `rows`; `relay_insert_rows`: `INSERT INTO outbox.deliveries … 'pending', 0 … ON \
                  CONFLICT DO NOTHING`",
        sqlite: "same insert as T2",
    },
    Row {
        transition: Transition::T4,
        from: &[NO_DELIVERY],
        to: PENDING,
        detail: " row",
        cause: "`CreateConsumer` with `start_from` `EARLIEST`: every retained message it matches, relayed or not, in \
               the creating transaction",
        postgres: "`consumer_create` → `delivery_insert_pending`: `INSERT … SELECT FROM unnest(…) ON CONFLICT DO \
                  NOTHING`; `consumer_insert` sets `backfill_seq`",
        sqlite: "`delivery_insert_pending`: the same from `json_each`",
    },
    Row {
        transition: Transition::T5,
        from: &[NO_DELIVERY],
        to: PENDING,
        detail: " row (count 0, due now)",
        cause: "`Replay` / `ReplayStream` of a message the consumer has no delivery of (not relayed yet, or before a \
               `NEW` consumer's start; only topics the consumer takes)",
        postgres: "`delivery_replay`: `INSERT … ON CONFLICT DO UPDATE`, raises `backfill_seq`",
        sqlite: "`delivery_replay`",
    },
    Row {
        transition: Transition::T6,
        from: &[PENDING],
        to: LEASED,
        detail: " (count + 1)",
        cause: "a stream's lease (`fill`) or a sink round; due, key free, not paused",
        postgres: "`delivery_lease` (`queries/lease.sql`) in one round trip: rows by `UPDATE outbox.deliveries SET \
                  state = 'leased', delivery_count = delivery_count + 1 …` (`FOR UPDATE SKIP LOCKED`), then for the \
                  room left `outbox.lease_pending_visible` moves the lowest seqs of the oldest pending ranges the \
                  statement can see into one new leased range (`INSERT INTO outbox.delivery_ranges … 'leased'`, \
                  count 1; ADR 0056)",
        sqlite: "`delivery_lease`: `ready_key_heads`, then one `UPDATE outbox_deliveries SET state = 'leased' \
                …`",
    },
    Row {
        transition: Transition::T7,
        from: &[LEASED],
        to: LEASED,
        detail: " (new deadline)",
        cause: "`Extend` from the session that holds it",
        postgres: "`delivery_extend_many`, one transaction: `outbox.unbatch(consumers, ids, session, NULL)` turns \
                  the named range-held seqs into `leased` rows (count 1, same holder and deadline), then `UPDATE` \
                  of the session's named `leased` rows: only the named deliveries move, as on SQLite",
        sqlite: "`delivery_extend_many`: `UPDATE` of the session's `leased` rows",
    },
    Row {
        transition: Transition::T8,
        from: &[LEASED],
        to: ACKED,
        detail: "",
        cause: "`Ack` on the stream (or a sink's confirmation); also a late ack of a lease the stream held until it \
               expired (ADR 0006)",
        postgres: "`delivery_ack_held` → `outbox.ack_seqs`: pending ranges, then leased ranges (their seqs to one \
                  new acked range, `INSERT INTO outbox.delivery_ranges … 'acked'`), then `UPDATE` of \
                  `leased`/`pending` rows, each step locking what it takes (ADR 0052). Sinks and relay-once: \
                  `delivery_ack_many` → `outbox.ack_batch(consumer, ids, at)` → the same",
        sqlite: "`delivery_ack_many` (`delivery_ack_held` defaults to it), one transaction sent in one round trip: \
                `UPDATE … SET state = 'acked' … WHERE state IN ('leased', 'pending')` of the deliveries that stay \
                rows, then a first delivery's row goes to an acked range (`INSERT INTO outbox_acked_ranges …`, then \
                `DELETE`; ADR 0070)",
    },
    Row {
        transition: Transition::T9,
        from: &[LEASED],
        to: ACKED,
        detail: "",
        cause: "transactional ack in the consumer's own transaction",
        postgres: "`outbox.ack`: `UPDATE` of a `leased` or `pending` row; else, in one snapshot, row, leased range \
                  and pending range; a range-held seq gets an `acked` row (count 1 from a leased range) by `INSERT \
                  … ON CONFLICT DO UPDATE … WHERE state IN ('leased', 'pending')`; loops up to 100 times, then \
                  SQLSTATE 40001",
        sqlite: "the documented statement ([sql-api.md](sql-api.md#sqlite-the-transactional-ack)): `UPDATE \
                outbox_deliveries SET state = 'acked' … WHERE … state IN ('leased', 'pending')`, run by \
                `outbox-client` (`client/src/store.rs`) and the Python client",
    },
    Row {
        transition: Transition::T10,
        from: &[PENDING],
        to: ACKED,
        detail: "",
        cause: "transactional ack of a delivery not leased (waiting, retrying, or never sent)",
        postgres: "`outbox.ack`: `UPDATE` of a `pending` row, or an `acked` row with count 0 for a seq in a pending \
                  range (the seq stays there, see the rule above)",
        sqlite: "the same `UPDATE` as T9",
    },
    Row {
        transition: Transition::T11,
        from: &[PENDING],
        to: ACKED,
        detail: "",
        cause: "a stream's ack of a delivery it no longer holds the lease of (a late ack after the sweeper or a \
               release made it pending), or a store-level ack by id of a never-sent delivery",
        postgres: "`outbox.ack_seqs`: step 3 for rows; step 1 for a seq in a pending range, which becomes an `acked` \
                  row with count 0",
        sqlite: "`delivery_ack_many`",
    },
    Row {
        transition: Transition::T12,
        from: &[LEASED],
        to: PENDING,
        detail: " (count kept, due at now + `retry_after` or backoff)",
        cause: "`Nack` below `max_deliveries` (`Failure::Nacked`); a sink's failed publish",
        postgres: "`delivery_release_many` with `ReleaseGuard::Session`, one transaction: `outbox.unbatch(consumers, \
                  ids, session, NULL)` turns the named range-held seqs into `leased` rows (count 1), then `UPDATE \
                  outbox.deliveries SET state = r.state …` on rows still `leased` by the session, skipping rows \
                  another transaction holds (`SKIP LOCKED`)",
        sqlite: "`delivery_release_many`: `UPDATE outbox_deliveries … FROM json_each(…)` on rows still `leased` by \
                the session",
    },
    Row {
        transition: Transition::T13,
        from: &[LEASED],
        to: DEAD,
        detail: "",
        cause: "`Nack` (or a failed sink publish) when `delivery_count >= max_deliveries`",
        postgres: "as T12, with `state = 'dead'`, `dead_at`",
        sqlite: "as T12",
    },
    Row {
        transition: Transition::T14,
        from: &[LEASED],
        to: PENDING,
        detail: " (due after the backoff, `last_error` \"ack deadline expired\")",
        cause: "lease expiry: the sweeper (`LeaseSweeper::run_once`, `Failure::Expired`) finds `lease_expires_at <= now`, below \
               `max_deliveries`",
        postgres: "`delivery_expired`: `outbox.unbatch(NULL, NULL, NULL, now)` (its own statement: every \
                  expired leased range becomes `leased` rows), then `SELECT` of expired `leased` rows; \
                  `delivery_release_many` with `ReleaseGuard::ExpiredAt(now)`: `outbox.unbatch` again, then the `UPDATE` \
                  of T12",
        sqlite: "`delivery_expired` (`SELECT`), `delivery_release_many` with the deadline guard",
    },
    Row {
        transition: Transition::T15,
        from: &[LEASED],
        to: DEAD,
        detail: "",
        cause: "lease expiry at `max_deliveries`",
        postgres: "as T14, `state = 'dead'`",
        sqlite: "as T14",
    },
    Row {
        transition: Transition::T16,
        from: &[LEASED],
        to: PENDING,
        detail: " (due now)",
        cause: "the stream ends: a clean close or outboxd's shutdown (\"stream closed before ack\", count given \
               back: `Attempt::Withdrawn`), or a broken stream below `max_deliveries` (\"stream broke before ack\", \
               count kept, for what the session had handed to the stream; what it had not is withdrawn as on a \
               clean close); `Session::release_all`. A sink whose target is unreachable releases the same way \
               (\"sink target unreachable before its confirmation\" in relay-once)",
        postgres: "`delivery_release_many` with `ReleaseGuard::Session`, as T12; a withdrawn release also sets \
                  `delivery_count = delivery_count - 1` in the same `UPDATE`",
        sqlite: "as T12, the same",
    },
    Row {
        transition: Transition::T17,
        from: &[LEASED],
        to: DEAD,
        detail: "",
        cause: "a broken stream (connection reset, response side gone, or a call the client cancelled: ADR 0074) \
               holding a delivery with `delivery_count >= max_deliveries`",
        postgres: "as T12, `state = 'dead'`",
        sqlite: "as T12",
    },
    Row {
        transition: Transition::T18,
        from: &[LEASED],
        to: PENDING,
        detail: " (due now, count given back: 0 for a first delivery)",
        cause: "a relay pass pushed to a stream that ended before the hand-over (`Offered::hand_over`, then \
               `Relay::release_unsent`), or pushes that reached a session after its stream ended \
               (`release_all(false)`)",
        postgres: "`delivery_release_many` with `ReleaseGuard::Session`, withdrawn, as T16",
        sqlite: "as T16",
    },
    Row {
        transition: Transition::T19,
        from: &[PENDING],
        to: PENDING,
        detail: ", now leasable",
        cause: "`available_at` passes (delay, backoff); the key's predecessor is acked or dead; `ResumeConsumer` \
               (`consumer_set_paused`)",
        postgres: "no write; the lease's conditions (above). Resume: `UPDATE outbox.consumers SET paused = …`",
        sqlite: "no write; resume: `UPDATE outbox_consumers SET paused = …`",
    },
    Row {
        transition: Transition::T20,
        from: &[ACKED],
        to: PENDING,
        detail: " (count 0, due now, `acked_at` cleared)",
        cause: "`Replay` / `ReplayStream` (by ids, time range, types, topics)",
        postgres: "`delivery_replay`, one transaction: locks the consumer's pending and leased ranges that hold any \
                  of the seqs (`delivery_ranges_lock_holding`: pending first, as `outbox.ack_seqs` takes them), \
                  then one statement upserts `… ON CONFLICT DO UPDATE … WHERE d.state <> 'leased'` (a seq in a \
                  leased range with no row is leased and skipped; one with a row, acked in the consumer's \
                  transaction, is replayed) and takes every replayed seq out of every range of the consumer (one \
                  `DELETE` of the ranges it empties, one `UPDATE` of the others on `outbox.delivery_ranges`): the \
                  row is then its one place",
        sqlite: "`delivery_replay`: the same upsert; a seq in an acked range gets a `pending` row, which decides \
                over the range",
    },
    Row {
        transition: Transition::T21,
        from: &[DEAD, DEAD_HOLDING_KEY],
        to: PENDING,
        detail: " (count 0, due now, `dead_at` and `last_error` cleared); a hold it made is lifted",
        cause: "`Replay` with `dead_letters` (or by id)",
        postgres: "`delivery_replay`; candidates from `dead` rows; its CTE `unheld` deletes the hold of a replayed \
                  message",
        sqlite: "`delivery_replay` (`DELETE FROM outbox_held_keys` first)",
    },
    Row {
        transition: Transition::T22,
        from: &[PENDING],
        to: PENDING,
        detail: " (count 0, due now)",
        cause: "`Replay` of a delivery that is pending as a row",
        postgres: "`delivery_replay`, as T20: a row is rewritten; a seq in a pending range leaves the range for a \
                  `pending` row (count 0, due now), as on SQLite",
        sqlite: "`delivery_replay`",
    },
    Row {
        transition: Transition::T23,
        from: &[ACKED],
        to: GONE,
        detail: "",
        cause: "prune (`Pruner`, every 10 minutes, or `Prune`): the message is relayed, enqueued before the cutoff, \
               and every delivery of it is `acked`",
        postgres: "`prune_before` under `PRUNE_LOCK`: fold acked count-0 rows out of pending ranges \
                  (`prune_fold_acked_rows`, `prune_empty_ranges`); `DELETE` rows and message for messages with no \
                  non-acked row, in no pending range, below every leased range, and take their seqs out of the acked \
                  ranges, deleting a range left with none (`prune_messages`, ADR 0083); delete the relay log's \
                  entries of pruned messages, and acked ranges older than the cutoff that name no message, as \
                  releases before ADR 0083 left them (`prune_acked_ranges`)",
        sqlite: "`prune_before`: `DELETE` rows and messages that are relayed, old enough, and have no non-acked row; \
                the range-held deliveries of those messages are counted (`prune_range_deliveries`) and the acked \
                ranges that hold no message any more deleted (`prune_acked_ranges`)",
    },
    Row {
        transition: Transition::T24,
        from: ANY,
        to: GONE,
        detail: "",
        cause: "`DeleteConsumer`",
        postgres: "`consumer_delete`: one `DELETE FROM outbox.delivery_ranges` of the consumer's ranges, and of the \
                  consumer (rows by `ON DELETE CASCADE`), under the consumers lock",
        sqlite: "`consumer_delete`: `DELETE FROM outbox_consumers` (rows by cascade)",
    },
    Row {
        transition: Transition::T25,
        from: &[LEASED],
        to: DEAD_HOLDING_KEY,
        detail: "",
        cause: "as T13, T15 or T17 for a keyed delivery of a consumer with `dead_key_policy = 'hold'` (ADR 0057): \
               its key's later deliveries wait",
        postgres: "`delivery_release_many`: the `UPDATE` of T12 returns the released rows and, in the same \
                  statement, `INSERT INTO outbox.held_keys … ON CONFLICT DO NOTHING` for the dead keyed ones of \
                  holding consumers",
        sqlite: "`delivery_release_many`: the same `UPDATE … RETURNING`, then `INSERT OR IGNORE INTO \
                outbox_held_keys`, one transaction",
    },
    Row {
        transition: Transition::T26,
        from: &[DEAD_HOLDING_KEY],
        to: DEAD,
        detail: ", key free",
        cause: "`ReleaseKey` with `skip_dead` (`replay:CONSUMER`, audited): the waiting deliveries go, in order, \
               without the dead one",
        postgres: "`held_key_release` (a provided method of `Store`): `held_key_page`, then `held_key_delete` \
                  (`DELETE FROM outbox.held_keys … RETURNING`)",
        sqlite: "the same on `outbox_held_keys`",
    },
    Row {
        transition: Transition::T27,
        from: &[DEAD_HOLDING_KEY],
        to: PENDING,
        detail: " (count 0, due now), key free",
        cause: "`ReleaseKey` without `skip_dead`: the dead message goes first, then the waiting ones once it is acked",
        postgres: "`held_key_release`: `held_key_delete` and `delivery_replay` in one transaction",
        sqlite: "the same",
    },
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::PathBuf;

    use super::*;

    const START: &str = "<!-- The transitions table is rendered from";
    const END: &str = "<!-- End of the rendered table. -->";

    fn page() -> (PathBuf, String) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/delivery-states.md");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        (path, text)
    }

    /// The lines that differ, `-` as the page has them and `+` as the code renders them.
    fn diff(page: &str, code: &str) -> String {
        let (p, c): (Vec<&str>, Vec<&str>) = (page.lines().collect(), code.lines().collect());
        let mut out = String::new();
        for i in 0..p.len().max(c.len()) {
            let (a, b) = (p.get(i), c.get(i));
            if a != b {
                if let Some(a) = a {
                    let _ = writeln!(out, "-{a}");
                }
                if let Some(b) = b {
                    let _ = writeln!(out, "+{b}");
                }
            }
        }
        out
    }

    #[test]
    fn the_rows_are_in_order_of_their_numbers() {
        for (i, t) in Transition::ALL.iter().enumerate() {
            assert_eq!(usize::from(t.number()), i + 1, "{t} is at {}", i + 1);
            assert_eq!(t.to_string(), format!("T{}", i + 1));
        }
        assert_eq!(Transition::ALL.iter().collect::<BTreeSet<_>>().len(), 27);
        // Every stage but "no delivery" is entered by some transition, every one but "gone" left.
        for s in Stage::ALL {
            assert!(s == NO_DELIVERY || Transition::ALL.iter().any(|t| t.to() == s), "nothing enters {s}");
            assert!(s == GONE || Transition::ALL.iter().any(|t| t.from().contains(&s)), "nothing leaves {s}");
        }
        assert_eq!(Transition::T24.arrow(), "any → gone");
        assert_eq!(Transition::T26.arrow(), "`dead` holding its key → `dead`, key free");
    }

    /// The page's transitions table is the one [`Transition::table`] renders.
    /// `OUTBOXD_WRITE_DOCS=1` writes it there instead of failing.
    #[test]
    fn the_pages_transitions_table_is_rendered_from_the_code() {
        let (path, text) = page();
        let start = text.find(START).expect("the page marks where the rendered table starts");
        let body = start + text[start..].find('\n').expect("a line after the start mark") + 1;
        let end = body + text[body..].find(END).expect("the page marks where the rendered table ends");
        let (on_page, rendered) = (&text[body..end], Transition::table() + "\n");
        if on_page == rendered {
            return;
        }
        if std::env::var_os("OUTBOXD_WRITE_DOCS").is_some() {
            let written = format!("{}{rendered}{}", &text[..body], &text[end..]);
            std::fs::write(&path, written).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            return;
        }
        panic!(
            "docs/delivery-states.md's transitions table differs from server/src/domain/transition.rs \
             (- the page, + the code); change the code and run \
             `OUTBOXD_WRITE_DOCS=1 cargo test -p outbox-server --lib domain::transition`:\n{}",
            diff(on_page, &rendered)
        );
    }

    /// Each edge of the page's mermaid diagram names the transitions from its node to its node,
    /// and each transition is drawn on an edge from every stage it leaves.
    #[test]
    fn the_pages_diagram_draws_each_transition_on_its_edges() {
        let (_, text) = page();
        let start = text.find("```mermaid").expect("the page has a diagram");
        let end = start + text[start..].find("\n```\n").expect("the diagram ends");
        let mut drawn: BTreeSet<(String, String, u8)> = BTreeSet::new();
        for line in text[start..end].lines() {
            let Some((edge, label)) = line.trim().split_once(": ") else { continue };
            let Some((from, to)) = edge.split_once(" --> ") else { continue };
            for word in label.split(|c: char| !c.is_ascii_alphanumeric()) {
                let Some(n) = word.strip_prefix('T').and_then(|n| n.parse::<u8>().ok()) else { continue };
                drawn.insert((from.to_owned(), to.to_owned(), n));
            }
        }
        let mut expected = BTreeSet::new();
        for t in Transition::ALL {
            for from in t.from() {
                expected.insert((from.diagram_node().to_owned(), t.to().diagram_node().to_owned(), t.number()));
            }
        }
        let missing: Vec<_> = expected.difference(&drawn).collect();
        let wrong: Vec<_> = drawn.difference(&expected).collect();
        assert!(
            missing.is_empty() && wrong.is_empty(),
            "the diagram of docs/delivery-states.md lacks the edges (from, to, transition) {missing:?} and \
             draws {wrong:?}, which the code does not have"
        );
    }

    /// The page lists the other tests of each transition in a table of its own, one line per
    /// transition, in order.
    #[test]
    fn the_page_lists_the_other_tests_of_every_transition() {
        let (_, text) = page();
        let start = text.find("| # | other tests |").expect("the page has a table of other tests");
        let numbers: Vec<String> = text[start..]
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with("| T"))
            .map(|l| l.split(" | ").next().unwrap_or_default().trim_start_matches("| ").to_owned())
            .collect();
        let expected: Vec<String> = Transition::ALL.iter().map(Transition::to_string).collect();
        assert_eq!(numbers, expected);
    }
}
