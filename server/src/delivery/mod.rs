//! Delivery to `Subscribe` streams: the [`session`] loop of one stream and its in-flight
//! [`window`] (held leases, room, expiry), a plain struct that tests drive with a manual clock.
pub mod session;
pub mod window;
