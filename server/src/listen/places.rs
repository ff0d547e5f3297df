//! The places of one listener's connections: general ones, those kept for health checks, the
//! count per client, and the connections not used yet that a full listener takes places back
//! from (ADR 0079).
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::metrics::CONNECTIONS_CLOSED;

use super::{Kind, ListenerLimits, PeerKey};

/// The connections of one listener: a place for each, up to the limits.
#[derive(Debug, Clone)]
pub struct ConnectionLimit {
    pub(super) shared: Arc<Shared>,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) limits: ListenerLimits,
    general: Arc<Semaphore>,
    reserve: Arc<Semaphore>,
    per_peer: Mutex<HashMap<PeerKey, usize>>,
    /// Connections that have not shown yet that they are used (opened a stream on an HTTP/2
    /// listener, made a signed-in request on the console): what a full listener takes places
    /// back from.
    waiting: Mutex<Waiting>,
}

/// Connections not shown used yet, by their peer's address (unique on one listener), and in
/// the order they were accepted, each kind apart.
#[derive(Debug, Default)]
struct Waiting {
    by_addr: HashMap<SocketAddr, (u64, Kind, Arc<Slot>)>,
    general: std::collections::BTreeMap<u64, SocketAddr>,
    health_only: std::collections::BTreeMap<u64, SocketAddr>,
    next: u64,
}

impl Waiting {
    fn by_age(&mut self, kind: Kind) -> &mut std::collections::BTreeMap<u64, SocketAddr> {
        match kind {
            Kind::General => &mut self.general,
            Kind::HealthOnly => &mut self.health_only,
        }
    }

    fn insert(&mut self, addr: SocketAddr, kind: Kind, slot: Arc<Slot>) {
        let seq = self.next;
        self.next += 1;
        if let Some((old, old_kind, _)) = self.by_addr.insert(addr, (seq, kind, slot)) {
            self.by_age(old_kind).remove(&old);
        }
        self.by_age(kind).insert(seq, addr);
    }

    /// Removes `addr`'s entry if it is `slot`'s (or any, without `slot`).
    fn remove(&mut self, addr: &SocketAddr, slot: Option<&Arc<Slot>>) {
        let ours = self.by_addr.get(addr).is_some_and(|(_, _, s)| slot.is_none_or(|slot| Arc::ptr_eq(s, slot)));
        if ours && let Some((seq, kind, _)) = self.by_addr.remove(addr) {
            self.by_age(kind).remove(&seq);
        }
    }

    fn contains(&self, addr: &SocketAddr) -> bool {
        self.by_addr.contains_key(addr)
    }

    /// The oldest of `kind`, taken out.
    fn pop_oldest(&mut self, kind: Kind) -> Option<(SocketAddr, Arc<Slot>)> {
        let (_, addr) = self.by_age(kind).pop_first()?;
        self.by_addr.remove(&addr).map(|(_, _, slot)| (addr, slot))
    }
}

/// What a connection's place is made of: the permit it holds (taken away when another
/// connection is given it) and the signal that closes the connection when that happens.
#[derive(Debug)]
pub(super) struct Slot {
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    pub(super) evicted: CancellationToken,
    /// Asks the connection to tell its client, with a GOAWAY, to open no more streams on it.
    pub(super) retired: CancellationToken,
}

/// A connection's place: given back, with its peer's count, when dropped.
#[derive(Debug)]
pub struct Place {
    pub(super) slot: Arc<Slot>,
    pub(super) kind: Kind,
    peer: PeerKey,
    pub(super) addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Place {
    /// Resolves when another connection has been given this place: a connection still in its
    /// TLS handshake gives up then, as a guarded one fails its next read or write.
    pub fn evicted(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.slot.evicted.clone().cancelled_owned()
    }

    /// Whether its connection has not shown yet that it is used (see [`ConnectionLimit::opened`]).
    pub(super) fn unused(&self) -> bool {
        self.shared.waiting.lock().unwrap_or_else(|p| p.into_inner()).contains(&self.addr)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut counts = self.shared.per_peer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.peer);
            }
        }
        drop(counts);
        self.shared.waiting.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.addr, Some(&self.slot));
    }
}

impl ConnectionLimit {
    pub fn new(limits: ListenerLimits) -> Self {
        Self {
            shared: Arc::new(Shared {
                limits,
                general: Arc::new(Semaphore::new(limits.max)),
                reserve: Arc::new(Semaphore::new(limits.health_reserve)),
                per_peer: Mutex::new(HashMap::new()),
                waiting: Mutex::new(Waiting::default()),
            }),
        }
    }

    /// A place for a connection from `addr` just accepted, or `None` (and it is counted) when
    /// its peer holds all it may or every place is taken by a connection in use: the caller
    /// drops the connection. When every place is taken, the connection that has waited longest
    /// without being used gives its place up and is closed (ADR 0079): a client that connects
    /// and uses its connection at once gets in however many idle ones others keep opening,
    /// from however many addresses.
    pub fn admit(&self, addr: SocketAddr) -> Option<Place> {
        let limits = &self.shared.limits;
        let peer = PeerKey::of(addr.ip());
        let mut counts = self.shared.per_peer.lock().unwrap_or_else(|p| p.into_inner());
        let held = counts.get(&peer).copied().unwrap_or(0);
        if held >= limits.per_peer {
            metrics::counter!(CONNECTIONS_CLOSED, "reason" => "max_connections_per_peer").increment(1);
            tracing::debug!(%peer, max = limits.per_peer, "connection refused: --max-connections-per-peer reached");
            return None;
        }
        let mut waiting = self.shared.waiting.lock().unwrap_or_else(|p| p.into_inner());
        // A general place, free or taken back from an idle connection; only when every general
        // connection is in use, a health place, free or taken back: a client is not given a
        // health place while an idle connection holds a general one.
        let general = match self.shared.general.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => Self::evict(&mut waiting, Kind::General),
        };
        let taken = match general {
            Some(p) => Some((p, Kind::General)),
            None => match self.shared.reserve.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => Self::evict(&mut waiting, Kind::HealthOnly),
            }
            .map(|p| (p, Kind::HealthOnly)),
        };
        let Some((permit, kind)) = taken else {
            metrics::counter!(CONNECTIONS_CLOSED, "reason" => "max_client_connections").increment(1);
            tracing::debug!(max = limits.max, "connection refused: --max-client-connections reached");
            return None;
        };
        counts.insert(peer, held + 1);
        drop(counts);
        let slot = Arc::new(Slot {
            permit: Mutex::new(Some(permit)),
            evicted: CancellationToken::new(),
            retired: CancellationToken::new(),
        });
        waiting.insert(addr, kind, slot.clone());
        Some(Place { slot, kind, peer, addr, shared: self.shared.clone() })
    }

    /// The place of the connection of `kind` that has waited longest without being used,
    /// taken from it (it is closed).
    fn evict(waiting: &mut Waiting, kind: Kind) -> Option<OwnedSemaphorePermit> {
        while let Some((addr, slot)) = waiting.pop_oldest(kind) {
            let taken = slot.permit.lock().unwrap_or_else(|p| p.into_inner()).take();
            slot.evicted.cancel();
            if let Some(permit) = taken {
                metrics::counter!(CONNECTIONS_CLOSED, "reason" => "evicted").increment(1);
                tracing::debug!(peer = %addr, "connection closed: its place went to a new connection (it had not been used)");
                return Some(permit);
            }
        }
        None
    }

    /// Retires the connection from `addr` if it has not been used (a health-only connection
    /// asked for something else): it sends its client a GOAWAY once the answers under way are
    /// out, so that the client opens its next stream on a new connection, for a place that
    /// serves it, and it is closed [`RETIRE_GRACE`] later if the client keeps it.
    pub fn retire_unused(&self, addr: SocketAddr) {
        let waiting = self.shared.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, slot)) = waiting.by_addr.get(&addr) {
            slot.retired.cancel();
        }
    }

    /// The connection from `addr` is used (it opened a stream; on the console, made a
    /// signed-in request): its first-stream deadline no longer holds, and its place is its own.
    pub fn opened(&self, addr: SocketAddr) {
        let mut waiting = self.shared.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if waiting.contains(&addr) {
            waiting.remove(&addr, None);
        }
    }
}
