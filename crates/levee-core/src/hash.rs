//! Levee's one stable hash: 64-bit FNV-1a.
//!
//! Whatever must come out the same on every node, platform, process and version — a key's
//! place on the ring, the replica list's digest, a state's anti-entropy fingerprint — is
//! hashed here, from explicit bytes. `std`'s hashers are seeded per process (`RandomState`)
//! or may change between Rust versions, and a derived `Hash` feeds bytes that depend on the
//! type's layout and the platform's endianness; none of them may be used for these.
//!
//! FNV-1a is not resistant to chosen inputs: it places and compares, it does not protect.
//!
//! ```
//! use levee_core::hash::{Fnv1a, fnv1a};
//!
//! assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
//! let mut h = Fnv1a::new();
//! h.write(b"a");
//! assert_eq!(h.finish(), fnv1a(b"a"));
//! ```

/// The FNV-1a 64-bit offset basis: the hash of no bytes.
pub const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// The FNV 64-bit prime.
pub const PRIME: u64 = 0x0000_0100_0000_01b3;

/// The 64-bit FNV-1a hash of `bytes`. The same for the same bytes on every platform and in
/// every version of Levee.
#[inline]
pub const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = Fnv1a::new();
    h.write(bytes);
    h.finish()
}

/// 64-bit FNV-1a fed piece by piece: feeding `a` then `b` gives the hash of their
/// concatenation.
///
/// It does not implement [`std::hash::Hasher`] on purpose: that trait's integer methods feed
/// native-endian bytes, which would make a hash depend on the platform. Integers are fed
/// little-endian here, whatever the platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv1a(u64);

impl Fnv1a {
    /// A hasher that has been fed nothing yet.
    #[inline]
    pub const fn new() -> Fnv1a {
        Fnv1a(OFFSET_BASIS)
    }

    /// Feeds `bytes`.
    #[inline]
    pub const fn write(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            self.0 ^= bytes[i] as u64;
            self.0 = self.0.wrapping_mul(PRIME);
            i += 1;
        }
    }

    /// Feeds `v` as its 8 little-endian bytes.
    #[inline]
    pub const fn write_u64(&mut self, v: u64) {
        self.write(&v.to_le_bytes());
    }

    /// The hash of everything fed so far. Feeding more afterwards continues from it.
    #[inline]
    pub const fn finish(&self) -> u64 {
        self.0
    }
}

impl Default for Fnv1a {
    fn default() -> Fnv1a {
        Fnv1a::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published FNV-1a 64 test vectors (Fowler, Noll, Vo).
    #[test]
    fn fnv1a_matches_the_published_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn feeding_in_pieces_hashes_the_concatenation() {
        let mut h = Fnv1a::new();
        h.write(b"foo");
        h.write(b"");
        h.write(b"bar");
        assert_eq!(h.finish(), fnv1a(b"foobar"));
        let mut h = Fnv1a::default();
        h.write_u64(0x0102_0304_0506_0708);
        assert_eq!(
            h.finish(),
            fnv1a(&[0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01])
        );
    }
}
