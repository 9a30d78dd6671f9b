//! An HDR histogram's counts, recorded without the `hdrhistogram` crate's
//! per-sample checks, and read (percentiles, the V2 encoding) from the
//! counts themselves, as the crate reads its own.
//!
//! The layout is the crate's exactly (`hdrhistogram-7.6.0/src/lib.rs`:
//! `new_with_bounds` for lowest discernible value 1, `bucket_for`,
//! `sub_bucket_for`, `index_for`, `value_for`): a value's bucket is the
//! number of powers of two it lies above the first bucket, its sub-bucket
//! its leading bits, so a sample costs a leading-zero count, two shifts
//! and an add. The tests build the crate's histogram from the counts (each
//! bucket's count recorded at the bucket's lowest value, which lands in the
//! same bucket) and check its counts, quantiles, V2 bytes and the highest
//! trackable value its auto-resizing reaches against the crate recording
//! each sample.
//! The counts are kept bucket by bucket, each allocated (zeroed) when a
//! value first falls in it: a latency's values span a few buckets far
//! from the first, and a histogram's array grown to its top (as the
//! crate's is) was zeroed and copied bucket after bucket.

#[cfg(test)]
use hdrhistogram::Histogram;

/// The counts of an auto-resizing HDR histogram with lowest discernible
/// value 1 and `digits` significant digits.
#[derive(Clone, Debug)]
pub struct Counts {
    digits: u8,
    /// log2 of the sub-bucket count (`sub_bucket_count_magnitude`).
    magnitude: u32,
    /// The counts by bucket, in `index_for` order: bucket 0's
    /// `2^magnitude`, each other's upper half (`2^(magnitude-1)`); empty
    /// for a bucket no value fell in.
    buckets: Vec<Vec<u64>>,
    total: u64,
}

impl Counts {
    /// No samples, to `digits` (1 to 5) significant digits.
    pub fn new(digits: u8) -> Counts {
        assert!((1..=5).contains(&digits), "1 to 5 significant digits");
        // The sub-bucket count is the power of two at or above 2·10^digits.
        let magnitude = (2 * 10u64.pow(u32::from(digits))).next_power_of_two().trailing_zeros();
        Counts { digits, magnitude, buckets: Vec::new(), total: 0 }
    }

    /// The bucket of `v` (`bucket_for`).
    fn bucket(&self, v: u64) -> u32 {
        let mask = (1u64 << self.magnitude) - 1;
        (64 - self.magnitude) - (v | mask).leading_zeros()
    }

    /// The bucket of `v` and its count's place there: `index_for`'s
    /// `((b + 1) << half) + (v >> b) − 2^half`, less the bucket's first index.
    fn locate(&self, v: u64) -> (usize, usize) {
        let b = self.bucket(v);
        let upper = usize::from(b != 0) << (self.magnitude - 1);
        (b as usize, (v >> b) as usize - upper)
    }

    /// The index (`index_for`) of bucket `b`'s first count, and its counts.
    fn span(&self, b: usize) -> (usize, usize) {
        let half = self.magnitude - 1;
        if b == 0 { (0, 1 << self.magnitude) } else { ((b + 1) << half, 1 << half) }
    }

    /// The lowest value of the count at `index` (`value_for`).
    fn value(&self, index: usize) -> u64 {
        let half = self.magnitude - 1;
        let bucket = (index >> half) as i64 - 1;
        let sub = (index as u64 & ((1 << half) - 1)) + (1 << half);
        if bucket < 0 { sub - (1 << half) } else { sub << bucket }
    }

    /// Each bucket a value fell in: the index of its first count, and its counts.
    fn spans(&self) -> impl Iterator<Item = (usize, &[u64])> {
        self.buckets.iter().enumerate().filter(|(_, c)| !c.is_empty()).map(|(b, c)| (self.span(b).0, &c[..]))
    }

    /// `(index, count)` of every count above zero, in index order.
    fn nonzero(&self) -> impl Iterator<Item = (usize, u64)> {
        self.spans()
            .flat_map(|(first, c)| c.iter().enumerate().filter(|(_, n)| **n > 0).map(move |(j, &n)| (first + j, n)))
    }

    /// Adds `n` samples of `v`.
    #[inline]
    pub fn record_n(&mut self, v: u64, n: u64) {
        let (b, j) = self.locate(v);
        match self.buckets.get_mut(b).and_then(|c| c.get_mut(j)) {
            // (Counts cannot reach 2⁶⁴: they count simulated events.)
            Some(c) => *c += n,
            None => *self.bucket_mut(b).get_mut(j).expect("within its bucket") += n,
        }
        self.total += n;
    }

    /// Bucket `b`'s counts, allocated if no value fell in it yet.
    #[cold]
    #[inline(never)]
    fn bucket_mut(&mut self, b: usize) -> &mut Vec<u64> {
        if self.buckets.len() <= b {
            self.buckets.resize_with(b + 1, Vec::new);
        }
        let len = self.span(b).1;
        let c = &mut self.buckets[b];
        if c.is_empty() {
            *c = vec![0; len];
        }
        c
    }

    /// Adds `o`'s samples (of the same digits).
    pub fn add(&mut self, o: &Counts) {
        debug_assert_eq!(self.digits, o.digits, "histograms of one layout");
        for (b, theirs) in o.buckets.iter().enumerate().filter(|(_, c)| !c.is_empty()) {
            for (a, n) in self.bucket_mut(b).iter_mut().zip(theirs) {
                *a += *n;
            }
        }
        self.total += o.total;
    }

    /// The lowest value equivalent to `v` (`lowest_equivalent`).
    pub fn lowest_equivalent(&self, v: u64) -> u64 {
        let b = self.bucket(v);
        (v >> b) << b
    }

    /// The highest value equivalent to `v` (`highest_equivalent`).
    pub fn highest_equivalent(&self, v: u64) -> u64 {
        if v == u64::MAX {
            return u64::MAX;
        }
        self.lowest_equivalent(v).saturating_add(1 << self.bucket(v)) - 1
    }

    /// The value at quantile `q` in [0, 1], as `value_at_quantile` gives
    /// it: the highest value equivalent to the first count at which the
    /// samples so far reach ⌈q·total⌉ (at least one).
    #[cfg(test)]
    pub fn value_at_quantile(&self, q: f64) -> u64 {
        let mut v = [0];
        self.values_at_quantiles(&[q], &mut v);
        v[0]
    }

    /// [`Self::value_at_quantile`] of each of `qs` (ascending) into `out`,
    /// in one pass over the counts.
    pub fn values_at_quantiles(&self, qs: &[f64], out: &mut [u64]) {
        debug_assert!(qs.is_sorted() && qs.len() == out.len());
        let target = |k: usize| ((qs[k].min(1.0) * self.total as f64).ceil() as u64).max(1);
        let (mut k, mut sum) = (0, 0u64);
        let Some(mut next) = (!qs.is_empty()).then(|| target(0)) else { return };
        // Eight counts at a time until the next target is within them (as
        // the crate scans), then one by one; buckets with no value add nothing.
        for (first, counts) in self.spans() {
            for (j, chunk) in counts.chunks(8).enumerate() {
                let chunk_sum: u64 = chunk.iter().sum();
                if sum + chunk_sum < next {
                    sum += chunk_sum;
                    continue;
                }
                for (i, &c) in chunk.iter().enumerate() {
                    sum += c;
                    while sum >= next {
                        let v = self.value(first + j * 8 + i);
                        out[k] = if qs[k] == 0.0 { self.lowest_equivalent(v) } else { self.highest_equivalent(v) };
                        k += 1;
                        if k == qs.len() {
                            return;
                        }
                        next = target(k);
                    }
                }
            }
        }
        out[k..].fill(0);
    }

    /// The highest trackable value the crate's histogram reaches: 2 as it
    /// starts, until a value falls beyond its first `2^magnitude` counts;
    /// then the top of the counts it grows to (`resize`: to the end of the
    /// value's bucket, `highest_equivalent(value_for(last_index()))`).
    fn highest_trackable(&self, top: usize) -> u64 {
        let half = self.magnitude - 1;
        if top < 1 << self.magnitude {
            return 2;
        }
        let len = ((top >> half) + 1) << half;
        self.highest_equivalent(self.value(len - 1))
    }

    /// Appends the crate's V2 encoding of these counts to `out`, byte for
    /// byte what `V2Serializer::serialize` writes for the crate's histogram
    /// (`serialization/v2_serializer.rs`: a 40-byte header, then the counts
    /// up to the highest recorded value's, zig-zag LEB128, a run of zeros
    /// as its negated length), without building the histogram.
    pub fn write_v2(&self, out: &mut Vec<u8>) {
        /// `V2_COOKIE` of `hdrhistogram::serialization` (not exported).
        const COOKIE: u32 = 0x1c84_9303 | 0x10;
        let top = self.nonzero().last().map_or(0, |(i, _)| i);
        let start = out.len();
        out.extend_from_slice(&COOKIE.to_be_bytes());
        out.extend_from_slice(&[0; 4]); // the payload's length, below
        out.extend_from_slice(&0u32.to_be_bytes()); // normalizing index offset
        out.extend_from_slice(&u32::from(self.digits).to_be_bytes());
        out.extend_from_slice(&1u64.to_be_bytes()); // lowest discernible value
        out.extend_from_slice(&self.highest_trackable(top).to_be_bytes());
        out.extend_from_slice(&1.0f64.to_be_bytes()); // integer-to-double ratio
        let body = out.len();
        let zigzag = |v: i64| ((v << 1) ^ (v >> 63)) as u64;
        // Counts 0..=top: each count above zero as itself, each zero before
        // one alone as 0, a run of them as its negated length.
        let mut next = 0;
        for (i, n) in self.nonzero() {
            match i - next {
                0 => {}
                1 => write_varint(0, out),
                zeros => write_varint(zigzag(-(zeros as i64)), out),
            }
            write_varint(zigzag(n as i64), out);
            next = i + 1;
        }
        if next == 0 {
            write_varint(0, out); // no sample: count 0 alone
        }
        let len = (out.len() - body) as u32;
        out[start + 4..start + 8].copy_from_slice(&len.to_be_bytes());
    }

    /// The `hdrhistogram` histogram of these counts (for the tests that
    /// compare with the crate).
    #[cfg(test)]
    pub fn histogram(&self) -> Histogram<u64> {
        let mut h = Histogram::new(self.digits).expect("1 to 5 significant digits are valid");
        for (i, c) in self.nonzero() {
            let v = self.value(i);
            if h.record_n(v, c).is_err() {
                h.saturating_record_n(v, c);
            }
        }
        h
    }
}

/// LEB128 as the crate's `varint_write` writes it: 7 bits a byte, low
/// first, a high bit on all but the last — except that a ninth byte holds
/// the last 8 bits whole.
fn write_varint(x: u64, out: &mut Vec<u8>) {
    for n in 0..8 {
        let rest = x >> (7 * (n + 1));
        if rest == 0 {
            out.push((x >> (7 * n)) as u8);
            return;
        }
        out.push((x >> (7 * n)) as u8 | 0x80);
    }
    out.push((x >> 56) as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::serialization::{Serializer, V2Serializer};

    fn v2(h: &Histogram<u64>) -> Vec<u8> {
        let mut out = Vec::new();
        V2Serializer::new().serialize(h, &mut out).unwrap();
        out
    }

    /// The layout, the quantiles and the serialized histogram are the
    /// crate's, sample for sample, at every precision and over values from
    /// 0 to beyond 2^40.
    #[test]
    fn counts_are_the_crates_histogram() {
        for digits in 1..=5 {
            let mut ours = Counts::new(digits);
            let mut theirs = Histogram::<u64>::new(digits).unwrap();
            let mut next = crate::rng::lcg_below(7 + u64::from(digits));
            for k in 0..3_000u64 {
                // Values spread over many magnitudes, a few repeated.
                let v = (next(1 << (k % 31)) << (k % 12)) + k % 3;
                let n = 1 + next(4);
                ours.record_n(v, n);
                theirs.record_n(v, n).unwrap();
                assert_eq!(ours.lowest_equivalent(v), theirs.lowest_equivalent(v), "digits {digits}, {v}");
                assert_eq!(ours.highest_equivalent(v), theirs.highest_equivalent(v), "digits {digits}, {v}");
            }
            let qs = [0.0, 0.001, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0];
            let mut at_once = [0; 8];
            ours.values_at_quantiles(&qs, &mut at_once);
            for (q, v) in qs.into_iter().zip(at_once) {
                assert_eq!(ours.value_at_quantile(q), theirs.value_at_quantile(q), "digits {digits}, q {q}");
                assert_eq!(v, theirs.value_at_quantile(q), "digits {digits}, q {q}, in one scan");
            }
            let mut encoded = Vec::new();
            ours.write_v2(&mut encoded);
            assert_eq!(encoded, v2(&theirs), "digits {digits}: the V2 encoding");
            let built = ours.histogram();
            assert_eq!((built.len(), built.distinct_values()), (theirs.len(), theirs.distinct_values()));
            assert_eq!(built.high(), theirs.high());
            assert_eq!(v2(&built), v2(&theirs), "digits {digits}");
        }
    }

    /// Empty, in the first bucket only, and with counts beyond 2⁵⁶ (nine
    /// varint bytes): encoded as the crate encodes them.
    #[test]
    fn v2_encoding_edges() {
        for values in [&[][..], &[0][..], &[5, 5, 2047][..], &[2048][..], &[3, 1 << 40][..]] {
            let mut ours = Counts::new(3);
            let mut theirs = Histogram::<u64>::new(3).unwrap();
            for &v in values {
                ours.record_n(v, 1);
                theirs.record_n(v, 1).unwrap();
            }
            ours.record_n(7, 1 << 60);
            theirs.record_n(7, 1 << 60).unwrap();
            let mut encoded = Vec::new();
            ours.write_v2(&mut encoded);
            assert_eq!(encoded, v2(&theirs), "{values:?}");
        }
        let (ours, mut encoded) = (Counts::new(2), Vec::new());
        ours.write_v2(&mut encoded);
        assert_eq!(encoded, v2(&Histogram::<u64>::new(2).unwrap()), "empty");
    }

    /// Adding counts gives what recording both sets into one histogram
    /// gives (the crate's own `add` would keep the addend's exact top as
    /// its trackable range; merged counts are only read for quantiles).
    #[test]
    fn add_is_recording_both() {
        let (mut a, mut b) = (Counts::new(3), Counts::new(3));
        let mut both = Histogram::<u64>::new(3).unwrap();
        for v in [0u64, 1, 2047, 2048, 5_000, 1_000_000] {
            a.record_n(v, 2);
            both.record_n(v, 2).unwrap();
        }
        for v in [3u64, 70_000_000, 9] {
            b.record_n(v, 1);
            both.record_n(v, 1).unwrap();
        }
        a.add(&b);
        assert_eq!(v2(&a.histogram()), v2(&both));
        assert_eq!(a.value_at_quantile(0.5), both.value_at_quantile(0.5));
    }
}
