//! Rendezvous (highest-random-weight) hashing: every instance computes the same ranking of live
//! instances for a key, without talking to the others, so exactly one acts first and the next ones
//! take over in a known order if it does not.
//!
//! The weight of instance `i` for key `k` is `mix64(fnv1a64(k ++ [0xFF] ++ i))`: FNV-1a 64-bit
//! (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`) over the UTF-8 bytes of the key, one
//! `0xFF` separator byte (never part of UTF-8, so `("ab","c")` and `("a","bc")` differ), then the
//! instance name; then the 64-bit finalizer of MurmurHash3 (`fmix64`), because FNV alone spreads
//! names that differ only in their last characters (`node-1`, `node-2`) poorly. Ties (practically
//! impossible) go to the smaller name. The function is fixed forever: instances of different
//! versions must agree during a rolling upgrade.
//!
//! Removing an instance only moves the keys it ranked first to their second choice; adding one only
//! takes keys away from others for which it now ranks first (the property that makes rendezvous
//! hashing suitable here: membership changes as nodes come and go).

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut hash = FNV_OFFSET;
    for byte in parts.iter().flat_map(|p| p.iter()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// FNV-1a 64-bit of a string (also the hashed label values of `node_mode::scope`).
pub(crate) fn fnv1a64_str(s: &str) -> u64 {
    fnv1a64(&[s.as_bytes()])
}

/// MurmurHash3's 64-bit finalizer: full avalanche, so nearby inputs get unrelated weights.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// The weight of `instance` for `key` (higher ranks first). Stable across processes and versions.
pub fn weight(key: &str, instance: &str) -> u64 {
    fmix64(fnv1a64(&[key.as_bytes(), &[0xFF], instance.as_bytes()]))
}

/// All `instances` ordered by their weight for `key`, highest first: element 0 acts, element 1
/// takes over if 0 does not, and so on. Duplicate names are kept once.
pub fn rendezvous_order<'a, I>(key: &str, instances: I) -> Vec<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    let mut ranked: Vec<(u64, &'a str)> = instances
        .into_iter()
        .map(|instance| (weight(key, instance), instance))
        .collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    ranked.dedup_by(|a, b| a.1 == b.1);
    ranked.into_iter().map(|(_, instance)| instance).collect()
}

/// Position of `me` in [`rendezvous_order`] for `key`, or `None` when `me` is not among the live
/// instances (then it must not act at all: an instance whose own driver is not registered is not
/// live).
pub fn rank_of<'a, I>(key: &str, me: &str, instances: I) -> Option<usize>
where
    I: IntoIterator<Item = &'a str>,
{
    let live: std::collections::HashSet<&str> = instances.into_iter().collect();
    if !live.contains(me) {
        return None;
    }
    let mine = weight(key, me);
    // Counting who outranks us is O(n) and needs no sort.
    let ahead = live
        .into_iter()
        .filter(|other| *other != me)
        .filter(|other| {
            let w = weight(key, other);
            w > mine || (w == mine && *other < me)
        })
        .count();
    Some(ahead)
}

#[cfg(test)]
#[path = "rendezvous_tests.rs"]
mod tests;
