//! The open streams of the process, of each connection and of each principal, and the places
//! ([`StreamPermit`], [`PrincipalStreamPermit`]) that give themselves back when dropped.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tonic::Status;

use super::budget::ByteBudget;
use super::{Limits, refused};

/// Counts the open streams of the process and of each client connection (known by its peer
/// address). [`StreamLimiter::acquire`] hands out a permit that gives its place back when dropped.
#[derive(Debug, Clone)]
pub struct StreamLimiter {
    limits: Limits,
    open: Arc<Mutex<OpenStreams>>,
    /// Without an auth file every caller is the one trusted caller: its streams share this
    /// budget, so that the process holds a bounded number of bytes for them too (ADR 0076).
    unauthenticated: Arc<ByteBudget>,
}

#[derive(Debug, Default)]
struct OpenStreams {
    total: usize,
    per_peer: HashMap<SocketAddr, usize>,
    per_principal: HashMap<Arc<str>, usize>,
    /// Each principal's in-flight byte budget, while a stream of it holds one.
    budgets: HashMap<Arc<str>, Arc<ByteBudget>>,
}

/// Who a request's quotas are counted against: the principal's name, put in the request's
/// extensions by the auth layer when an auth file is in force (without one there is no
/// per-principal quota: every caller is the same unrestricted one, whose streams share one
/// byte budget).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaKey(pub Arc<str>);

/// One principal's open stream (counted from the moment it opens); returned when dropped.
#[derive(Debug)]
pub struct PrincipalStreamPermit {
    open: Arc<Mutex<OpenStreams>>,
    principal: Option<Arc<str>>,
    budget: Option<Arc<ByteBudget>>,
}

impl PrincipalStreamPermit {
    /// The byte budget the principal's streams share (without an auth file, the one every
    /// caller shares).
    pub fn in_flight_bytes(&self) -> Option<Arc<ByteBudget>> {
        self.budget.clone()
    }
}

impl Drop for PrincipalStreamPermit {
    fn drop(&mut self) {
        let Some(principal) = &self.principal else { return };
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.per_principal.get_mut(principal) {
            *n -= 1;
            if *n == 0 {
                open.per_principal.remove(principal);
            }
        }
    }
}

/// One open stream's place; returned when dropped.
#[derive(Debug)]
pub struct StreamPermit {
    open: Arc<Mutex<OpenStreams>>,
    peer: Option<SocketAddr>,
}

impl StreamLimiter {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            open: Arc::default(),
            unauthenticated: ByteBudget::new(limits.max_in_flight_bytes_per_principal),
        }
    }

    /// A place for one more stream from `peer`, or RESOURCE_EXHAUSTED naming the limit that is
    /// reached. A request without a peer address (not TCP) counts only towards the process.
    #[allow(clippy::result_large_err)] // a Status is what the caller returns
    pub fn acquire(&self, peer: Option<SocketAddr>) -> Result<StreamPermit, Status> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.total >= self.limits.max_streams {
            refused("max_streams");
            return Err(Status::resource_exhausted(format!(
                "too many streams: this outboxd already serves {} streams, the limit is {} (--max-streams)",
                open.total, self.limits.max_streams
            )));
        }
        if let Some(peer) = peer {
            let on_connection = open.per_peer.get(&peer).copied().unwrap_or(0);
            if on_connection >= self.limits.max_streams_per_connection {
                refused("max_streams_per_connection");
                return Err(Status::resource_exhausted(format!(
                    "too many streams on this connection: {on_connection} open, the limit is {} \
                     (--max-streams-per-connection); open another connection or close streams",
                    self.limits.max_streams_per_connection
                )));
            }
            *open.per_peer.entry(peer).or_default() += 1;
        }
        open.total += 1;
        Ok(StreamPermit { open: self.open.clone(), peer })
    }

    /// A place for one more stream of `principal`, taken as the stream opens, before it has
    /// said what it wants: one principal's streams cannot take every place of the process. With
    /// no principal (no auth file) it always succeeds, and its streams share one byte budget.
    #[allow(clippy::result_large_err)] // a Status is what the caller returns
    pub fn acquire_principal(&self, principal: Option<&QuotaKey>) -> Result<PrincipalStreamPermit, Status> {
        let Some(QuotaKey(name)) = principal else {
            let budget = Some(self.unauthenticated.clone());
            return Ok(PrincipalStreamPermit { open: self.open.clone(), principal: None, budget });
        };
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let held = open.per_principal.get(name).copied().unwrap_or(0);
        if held >= self.limits.max_streams_per_principal {
            refused("max_streams_per_principal");
            return Err(Status::resource_exhausted(format!(
                "too many streams of principal {name:?}: {held} open, the limit is {} (--max-streams-per-principal)",
                self.limits.max_streams_per_principal
            )));
        }
        *open.per_principal.entry(name.clone()).or_default() += 1;
        // Budgets nobody holds any more are forgotten (a reloaded auth file may have renamed
        // the principal): a stream, its window and the relay's offers hold theirs.
        open.budgets.retain(|_, b| Arc::strong_count(b) > 1);
        let limit = self.limits.max_in_flight_bytes_per_principal;
        let budget = open.budgets.entry(name.clone()).or_insert_with(|| ByteBudget::new(limit)).clone();
        Ok(PrincipalStreamPermit { open: self.open.clone(), principal: Some(name.clone()), budget: Some(budget) })
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(peer) = self.peer
            && let Some(n) = open.per_peer.get_mut(&peer)
        {
            *n -= 1;
            if *n == 0 {
                open.per_peer.remove(&peer);
            }
        }
    }
}
