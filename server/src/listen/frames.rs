//! Following an HTTP/2 connection's frames by their headers alone: the PING and SETTINGS frames
//! a client sends are counted, and a GOAWAY goes out only between two of h2's frames.
use std::time::{Duration, Instant};

/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`: what an HTTP/2 client sends first.
pub(super) const PREFACE_LEN: usize = 24;

/// PING and SETTINGS frames (not acknowledgements) one HTTP/2 connection may send per
/// [`CONTROL_FRAME_WINDOW`]; h2 answers each one, at whatever pace the client reads, so without a
/// bound a client makes outboxd answer for ever; beyond it the connection is sent GOAWAY
/// (ENHANCE_YOUR_CALM) and closed. A client sends a keepalive PING every few
/// seconds and SETTINGS a few times; one that measures its bandwidth (BDP) a PING per round
/// trip while data flows: this leaves room for that and stops a flood.
pub const MAX_CONTROL_FRAMES: u32 = 1000;
pub const CONTROL_FRAME_WINDOW: Duration = Duration::from_secs(10);
const FRAME_PING: u8 = 6;
const FRAME_SETTINGS: u8 = 4;
const FRAME_HEADERS: u8 = 1;
const FRAME_GOAWAY: u8 = 7;
pub(super) const ENHANCE_YOUR_CALM: u32 = 0xb;
pub(super) const NO_ERROR: u32 = 0;
const FLAG_ACK: u8 = 1;

/// Follows the frames of one direction of an HTTP/2 connection, reading only their headers.
#[derive(Debug)]
struct FrameScan {
    /// Preface bytes still to pass.
    preface_left: usize,
    header: [u8; 9],
    have: usize,
    /// Payload bytes of the current frame still to pass.
    skip: usize,
}

impl FrameScan {
    fn new(preface: usize) -> Self {
        Self { preface_left: preface, header: [0; 9], have: 0, skip: 0 }
    }

    /// Passes `bytes`, handing `each` every frame header completed, until it returns false.
    fn pass(&mut self, mut bytes: &[u8], mut each: impl FnMut(&[u8; 9]) -> bool) -> bool {
        let pass = self.preface_left.min(bytes.len());
        self.preface_left -= pass;
        bytes = &bytes[pass..];
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < 9 {
                break;
            }
            self.have = 0;
            let h = self.header;
            self.skip = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
            if !each(&h) {
                return false;
            }
        }
        true
    }

    /// Between two frames: a frame of our own can go here.
    fn at_boundary(&self) -> bool {
        self.preface_left == 0 && self.have == 0 && self.skip == 0
    }
}

/// Counts a connection's PING and SETTINGS frames, and follows what h2 writes, so that a
/// flooding connection can be sent GOAWAY between two of h2's frames before it is closed.
#[derive(Debug)]
pub(super) struct FrameCounter {
    read: FrameScan,
    written: FrameScan,
    /// The highest stream the client opened (the GOAWAY's last stream).
    last_stream: u32,
    window: Instant,
    count: u32,
}

impl Default for FrameCounter {
    fn default() -> Self {
        Self {
            read: FrameScan::new(PREFACE_LEN),
            written: FrameScan::new(0),
            last_stream: 0,
            window: Instant::now(),
            count: 0,
        }
    }
}

impl FrameCounter {
    /// Whether the bytes read keep the connection under its bound.
    pub(super) fn read(&mut self, bytes: &[u8]) -> bool {
        let (window, count, last_stream) = (&mut self.window, &mut self.count, &mut self.last_stream);
        self.read.pass(bytes, |h| {
            if h[3] == FRAME_HEADERS {
                let id = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                *last_stream = (*last_stream).max(id);
            }
            if !(matches!(h[3], FRAME_PING | FRAME_SETTINGS) && h[4] & FLAG_ACK == 0) {
                return true;
            }
            if window.elapsed() >= CONTROL_FRAME_WINDOW {
                *window = Instant::now();
                *count = 0;
            }
            *count += 1;
            *count <= MAX_CONTROL_FRAMES
        })
    }

    pub(super) fn written(&mut self, bytes: &[u8]) {
        self.written.pass(bytes, |_| true);
    }

    /// GOAWAY with ENHANCE_YOUR_CALM, if it can go between two of h2's frames.
    pub(super) fn goaway(&self, error: u32) -> Option<[u8; 17]> {
        if !self.written.at_boundary() {
            return None;
        }
        let mut f = [0u8; 17];
        f[2] = 8;
        f[3] = FRAME_GOAWAY;
        f[9..13].copy_from_slice(&self.last_stream.to_be_bytes());
        f[13..17].copy_from_slice(&error.to_be_bytes());
        Some(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, len: usize) -> Vec<u8> {
        let l = u32::try_from(len).unwrap().to_be_bytes();
        let mut f = vec![l[1], l[2], l[3], kind, flags, 0, 0, 0, 1];
        f.resize(9 + len, 0);
        f
    }

    #[test]
    fn control_frames_are_counted_across_reads_of_any_size_and_acks_are_not() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        // A DATA frame whose payload holds PING-looking bytes, then PINGs, SETTINGS and acks.
        let mut data = frame(0, 0, 9);
        data[9..].copy_from_slice(&frame(FRAME_PING, 0, 0));
        bytes.extend(data);
        for _ in 0..MAX_CONTROL_FRAMES / 2 {
            bytes.extend(frame(FRAME_PING, 0, 8));
            bytes.extend(frame(FRAME_SETTINGS, 0, 6));
            bytes.extend(frame(FRAME_PING, FLAG_ACK, 8));
            bytes.extend(frame(FRAME_SETTINGS, FLAG_ACK, 0));
        }
        for chunk in [1, 7, 9, 4096] {
            let mut c = FrameCounter::default();
            assert!(bytes.chunks(chunk).all(|b| c.read(b)), "chunks of {chunk}");
            assert_eq!(c.count, MAX_CONTROL_FRAMES, "chunks of {chunk}");
            assert!(!c.read(&frame(FRAME_PING, 0, 8)), "one more");
        }
    }

    #[test]
    fn a_goaway_goes_only_between_two_written_frames() {
        let mut c = FrameCounter::default();
        assert!(c.goaway(ENHANCE_YOUR_CALM).is_some());
        let settings = frame(FRAME_SETTINGS, 0, 12);
        c.written(&settings[..5]);
        assert!(c.goaway(ENHANCE_YOUR_CALM).is_none());
        c.written(&settings[5..]);
        let goaway = c.goaway(ENHANCE_YOUR_CALM).unwrap();
        assert_eq!((goaway[3], &goaway[13..]), (FRAME_GOAWAY, &[0, 0, 0, 0xb][..]));
    }
}
