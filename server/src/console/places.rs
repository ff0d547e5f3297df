//! The console's request places (ADR 0075): requests of a signed-in principal and requests of
//! anyone else (the sign-in page and form, assets, redirects) take places of separate counts,
//! so that nobody who has not signed in can take the places of those who have; anonymous
//! requests of one client address, and signed-in requests of one principal, are bounded, so
//! that one client cannot take all of the first and one principal all of the second;
//! and failed sign-ins are limited per client address and logged a line per address and
//! interval rather than a line per guess.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::listen::PeerKey;

/// Requests of signed-in principals handled at once; more are answered 503 at once. Each
/// reads the database through the pool the data plane uses, so this bounds what the console
/// can take of it.
pub const SIGNED_IN_PLACES: usize = 8;
/// Of those, what one principal may hold: another principal always finds places.
pub const SIGNED_IN_PLACES_PER_PRINCIPAL: usize = 4;
/// Requests of callers who have not signed in, handled at once (a sign-in form's body arrives
/// within one of these).
pub const ANONYMOUS_PLACES: usize = 4;
/// Of those, what one client address may hold.
pub const ANONYMOUS_PLACES_PER_PEER: usize = 2;
/// Failed sign-ins one client address may make per [`SIGN_IN_WINDOW`]; beyond it, sign-ins
/// are answered 429 until the window ends.
pub const MAX_FAILED_SIGN_INS: u32 = 10;
pub const SIGN_IN_WINDOW: Duration = Duration::from_secs(60);
/// Client addresses whose failed sign-ins are counted at once; beyond it, a new address is
/// not limited (each guess of a token is still a guess of a random token) and its refusals
/// are counted together.
const MAX_TRACKED_PEERS: usize = 10_000;

/// The place a request holds while it is handled.
#[derive(Debug)]
pub struct Held {
    _permit: OwnedSemaphorePermit,
    holder: Holder,
    places: Arc<Places>,
}

/// Whose share a place is counted in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Holder {
    /// An anonymous request's client address.
    Peer(PeerKey),
    /// A signed-in request's principal.
    Principal(Arc<str>),
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.places.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.holder) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.holder);
            }
        }
    }
}

#[derive(Debug)]
pub struct Places {
    signed_in: Arc<Semaphore>,
    anonymous: Arc<Semaphore>,
    /// Places held by each client address (anonymous) and each principal (signed in).
    held: Mutex<HashMap<Holder, usize>>,
    sign_ins: Mutex<SignIns>,
}

#[derive(Debug, Default)]
struct SignIns {
    peers: HashMap<PeerKey, Failures>,
    /// Refusals of addresses not tracked, since the last flush.
    untracked: u64,
}

#[derive(Debug)]
struct Failures {
    since: Instant,
    count: u32,
    /// How many of `count` have been logged.
    logged: u32,
}

impl Default for Places {
    fn default() -> Self {
        Self {
            signed_in: Arc::new(Semaphore::new(SIGNED_IN_PLACES)),
            anonymous: Arc::new(Semaphore::new(ANONYMOUS_PLACES)),
            held: Mutex::new(HashMap::new()),
            sign_ins: Mutex::new(SignIns::default()),
        }
    }
}

fn key(peer: Option<SocketAddr>) -> PeerKey {
    PeerKey::of(peer.map_or(std::net::IpAddr::from([0, 0, 0, 0]), |p| p.ip()))
}

impl Places {
    /// A place for a signed-in principal's request, or `None`: all are taken, or this
    /// principal holds its share.
    pub fn signed_in(self: &Arc<Self>, principal: Arc<str>) -> Option<Held> {
        self.take(&self.signed_in, Holder::Principal(principal), SIGNED_IN_PLACES_PER_PRINCIPAL)
    }

    /// A place for anyone else's request, or `None`: all are taken, or this client holds its share.
    pub fn anonymous(self: &Arc<Self>, peer: Option<SocketAddr>) -> Option<Held> {
        self.take(&self.anonymous, Holder::Peer(key(peer)), ANONYMOUS_PLACES_PER_PEER)
    }

    fn take(self: &Arc<Self>, of: &Arc<Semaphore>, holder: Holder, share: usize) -> Option<Held> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.get(&holder).copied().unwrap_or(0);
        if n >= share {
            return None;
        }
        let permit = of.clone().try_acquire_owned().ok()?;
        held.insert(holder.clone(), n + 1);
        Some(Held { _permit: permit, holder, places: self.clone() })
    }

    /// How long until this client may try to sign in again, if it has failed too often.
    pub fn sign_in_blocked(&self, peer: Option<SocketAddr>) -> Option<Duration> {
        let sign_ins = self.sign_ins.lock().unwrap_or_else(|p| p.into_inner());
        let f = sign_ins.peers.get(&key(peer))?;
        let left = SIGN_IN_WINDOW.checked_sub(f.since.elapsed())?;
        (f.count >= MAX_FAILED_SIGN_INS && !left.is_zero()).then_some(left)
    }

    /// A sign-in was refused: counted against its client; the first refusal of a window is
    /// logged at once, the rest when the window ends ([`Places::flush`]).
    pub fn sign_in_failed(&self, peer: Option<SocketAddr>) {
        let k = key(peer);
        let mut sign_ins = self.sign_ins.lock().unwrap_or_else(|p| p.into_inner());
        let ended = sign_ins.peers.get(&k).is_some_and(|f| f.since.elapsed() >= SIGN_IN_WINDOW);
        if ended && let Some(f) = sign_ins.peers.remove(&k) {
            report(k, &f);
        }
        if !sign_ins.peers.contains_key(&k) && sign_ins.peers.len() >= MAX_TRACKED_PEERS {
            sign_ins.untracked += 1;
            return;
        }
        let f = sign_ins.peers.entry(k).or_insert_with(|| Failures { since: Instant::now(), count: 0, logged: 0 });
        f.count += 1;
        if f.logged == 0 {
            f.logged = 1;
            tracing::warn!(
                target: "outboxd::audit", peer = %k, action = "console_sign_in", outcome = "refused", refused = 1,
                "console sign-in refused (further refusals of this address are counted, and logged once a minute)"
            );
        }
    }

    /// Logs and forgets the windows that have ended.
    pub fn flush(&self) {
        let mut sign_ins = self.sign_ins.lock().unwrap_or_else(|p| p.into_inner());
        sign_ins.peers.retain(|k, f| {
            let ended = f.since.elapsed() >= SIGN_IN_WINDOW;
            if ended {
                report(*k, f);
            }
            !ended
        });
        if sign_ins.untracked > 0 {
            tracing::warn!(
                target: "outboxd::audit", action = "console_sign_in", outcome = "refused", refused = sign_ins.untracked,
                "console sign-ins refused from addresses beyond those counted one by one"
            );
            sign_ins.untracked = 0;
        }
    }
}

/// The refusals of a window not logged yet.
fn report(peer: PeerKey, f: &Failures) {
    let more = f.count.saturating_sub(f.logged);
    if more > 0 {
        tracing::warn!(
            target: "outboxd::audit", peer = %peer, action = "console_sign_in", outcome = "refused", refused = more,
            limited = f.count >= MAX_FAILED_SIGN_INS, "console sign-ins refused in the last minute"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_places_are_bounded_per_client_and_apart_from_signed_in_ones() {
        let places = Arc::new(Places::default());
        let a: Option<SocketAddr> = Some("127.0.0.2:1".parse().unwrap());
        let b: Option<SocketAddr> = Some("127.0.0.3:1".parse().unwrap());
        let held: Vec<_> = (0..ANONYMOUS_PLACES_PER_PEER).map(|_| places.anonymous(a).unwrap()).collect();
        assert!(places.anonymous(a).is_none());
        let other = places.anonymous(b).unwrap();
        let (alice, bob): (Arc<str>, Arc<str>) = ("alice".into(), "bob".into());
        let mut signed_in: Vec<_> =
            (0..SIGNED_IN_PLACES_PER_PRINCIPAL).map(|_| places.signed_in(alice.clone()).unwrap()).collect();
        assert!(places.signed_in(alice.clone()).is_none(), "one principal holds at most its share");
        signed_in.extend(
            (0..SIGNED_IN_PLACES - SIGNED_IN_PLACES_PER_PRINCIPAL).map(|_| places.signed_in(bob.clone()).unwrap()),
        );
        assert!(places.signed_in("carol".into()).is_none(), "all places are taken");
        drop(held);
        assert!(places.anonymous(a).is_some());
        signed_in.truncate(1);
        assert!(places.signed_in(alice).is_some(), "places given back are counted back");
        drop((other, signed_in));
    }

    #[test]
    fn failed_sign_ins_are_limited_per_client() {
        let places = Places::default();
        let a: Option<SocketAddr> = Some("127.0.0.2:1".parse().unwrap());
        for _ in 0..MAX_FAILED_SIGN_INS {
            assert!(places.sign_in_blocked(a).is_none());
            places.sign_in_failed(a);
        }
        let wait = places.sign_in_blocked(a).unwrap();
        assert!(wait <= SIGN_IN_WINDOW && wait > Duration::ZERO);
        assert!(places.sign_in_blocked(Some("127.0.0.3:1".parse().unwrap())).is_none());
    }
}
