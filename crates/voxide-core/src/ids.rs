//! Random numbers for ids (RTP SSRCs, SIP tags and branches, provider context ids), without a
//! dependency for them: not for anything secret.

/// A random number from the process's hash seed and the clock.
pub fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish() as u32
}
