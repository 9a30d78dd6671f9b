//! A ragged grid of measured latencies, interpolated as aiconfigurator's
//! `perf_interp` does for its attention tables (aiconfigurator-core,
//! `perf_database/perf_interp.rs`): an exact hit is the measurement; inside
//! the grid, each axis in turn brackets the query between its two nearest
//! keys and blends them linearly (one axis may blend square roots, as
//! attention's latency grows with the square of the sequence); where one
//! side of a bracket has no data the other is scaled by the speed-of-light
//! ratio; outside the grid the utilisation (speed of light ÷ latency) of
//! the four nearest points in log₂ space is held, with tapered Shepard
//! weights `((R − d)/(R·d))²`, R the distance of the fifth.

use std::collections::BTreeMap;

/// A key along one axis (integers in every table; ordered as integers).
type Key = i64;

/// One level of the grid.
#[derive(Clone, Debug, Default)]
pub(super) struct Node {
    children: BTreeMap<Key, Node>,
    value: Option<f64>,
}

/// A grid with its points listed once (for the hold outside it).
#[derive(Clone, Debug, Default)]
pub(super) struct Grid {
    root: Node,
    /// Every point's coordinates (`dims` per point, flat).
    coords: Vec<f64>,
    /// Their log₂, likewise.
    logs: Vec<f64>,
    /// Every point's latency.
    latency: Vec<f64>,
    /// Coordinates per point.
    dims: usize,
    /// The smallest and largest coordinate on each axis.
    ranges: Vec<(f64, f64)>,
    /// The axis with the most distinct values (the one that best tells
    /// points apart), and the points with a positive latency (those the
    /// hold can use) ordered by the log₂ of their coordinate on it: (that
    /// log, point index).
    by_axis: (usize, Vec<(f64, usize)>),
}

impl Grid {
    /// The grid of `root`.
    pub fn new(root: Node) -> Grid {
        // Every point's coordinates, one after another (no vector per point):
        // (where its coordinates start in `flat`, how many, its latency).
        let (mut flat, mut points) = (Vec::new(), Vec::new());
        root.leaves(&mut Vec::new(), &mut flat, &mut points);
        let dims = points.first().map_or(0, |p| p.1);
        let ranges = (0..dims)
            .map(|d| {
                let v = points.iter().filter(|p| d < p.1).map(|p| flat[p.0 + d]);
                (v.clone().fold(f64::INFINITY, f64::min), v.fold(f64::NEG_INFINITY, f64::max))
            })
            .collect();
        // Points of another dimension (a malformed table) are left out of the hold.
        let points = points.iter().filter(|p| p.1 == dims);
        let coords: Vec<f64> = points.clone().flat_map(|p| flat[p.0..p.0 + dims].iter().copied()).collect();
        let logs: Vec<f64> = coords.iter().map(|&x| log(x)).collect();
        let latency: Vec<f64> = points.map(|p| p.2).collect();
        let distinct = |a: usize| {
            let mut v: Vec<u64> = (0..latency.len()).map(|i| logs[i * dims + a].to_bits()).collect();
            v.sort_unstable();
            v.dedup();
            v.len()
        };
        let axis = (0..dims).max_by_key(|&a| (distinct(a), std::cmp::Reverse(a))).unwrap_or(0);
        let mut order: Vec<(f64, usize)> = (0..latency.len())
            // (As the hold has always read them: a NaN latency is not ≤ 0.)
            .filter(|&i| latency[i] > 0.0 || latency[i].is_nan())
            .map(|i| (logs[i * dims + axis], i))
            .collect();
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        Grid { root, coords, logs, latency, dims, ranges, by_axis: (axis, order) }
    }

    /// Whether the grid holds no point.
    pub fn is_empty(&self) -> bool {
        self.latency.is_empty()
    }

    /// The smallest and largest coordinate of axis `d`.
    pub fn range(&self, d: usize) -> (f64, f64) {
        self.ranges[d]
    }

    /// The latency at `q`; `sol` is the speed of light of a point, `sqrt_axis`
    /// the axis blended in square roots.
    pub fn query(&self, q: &[f64], sol: &dyn Fn(&[f64]) -> f64, sqrt_axis: Option<usize>) -> f64 {
        if let Some(v) = self.root.exact(q) {
            return v;
        }
        match self.root.interior(q, 0, sol, sqrt_axis) {
            Ok(v) => v,
            Err(OutOfRange) => self.hold(q, sol),
        }
    }
}

/// The query left the grid: hold utilisation instead.
struct OutOfRange;

impl Node {
    /// Inserts `value` at `path` unless a value is there already (the first
    /// row of a table wins, as aiconfigurator loads it).
    pub fn insert(&mut self, path: &[Key], value: f64) {
        let mut node = self;
        for &k in path {
            node = node.children.entry(k).or_default();
        }
        node.value.get_or_insert(value);
    }

    fn exact(&self, q: &[f64]) -> Option<f64> {
        let mut node = self;
        for &c in q {
            if c.fract() != 0.0 {
                return None;
            }
            node = node.children.get(&(c as Key))?;
        }
        node.value
    }

    fn interior(
        &self,
        q: &[f64],
        depth: usize,
        sol: &dyn Fn(&[f64]) -> f64,
        sqrt_axis: Option<usize>,
    ) -> Result<f64, OutOfRange> {
        if depth == q.len() {
            return self.value.ok_or(OutOfRange);
        }
        let c = q[depth];
        if c.fract() == 0.0
            && let Some(child) = self.children.get(&(c as Key))
        {
            return child.interior(q, depth + 1, sol, sqrt_axis);
        }
        let (Some((&first, _)), Some((&last, _))) = (self.children.first_key_value(), self.children.last_key_value())
        else {
            return Err(OutOfRange);
        };
        if c < first as f64 || c > last as f64 {
            return Err(OutOfRange);
        }
        let (&lo, lo_node) = self.children.range(..=c.floor() as Key).next_back().ok_or(OutOfRange)?;
        let (&hi, hi_node) = self.children.range(c.ceil() as Key..).next().ok_or(OutOfRange)?;
        let a = lo_node.interior(q, depth + 1, sol, sqrt_axis).ok();
        let b = hi_node.interior(q, depth + 1, sol, sqrt_axis).ok();
        let snapped = |k: Key| {
            let mut s = q.to_vec();
            s[depth] = k as f64;
            s
        };
        match (a, b) {
            (None, None) => Err(OutOfRange),
            (Some(v), None) => Ok(v * sol(q) / sol(&snapped(lo))),
            (None, Some(v)) => Ok(v * sol(q) / sol(&snapped(hi))),
            (Some(a), Some(b)) => {
                let w = (c - lo as f64) / (hi - lo) as f64;
                Ok(if sqrt_axis == Some(depth) {
                    let s = a.sqrt() + (b.sqrt() - a.sqrt()) * w;
                    s * s
                } else {
                    a + (b - a) * w
                })
            }
        }
    }

    /// Every valued node under this one, in key order: its path's
    /// coordinates appended to `flat`, and (their start, count, value) to `out`.
    fn leaves(&self, path: &mut Vec<f64>, flat: &mut Vec<f64>, out: &mut Vec<(usize, usize, f64)>) {
        if let Some(v) = self.value {
            out.push((flat.len(), path.len(), v));
            flat.extend_from_slice(path);
        }
        for (&k, child) in &self.children {
            path.push(k as f64);
            child.leaves(path, flat, out);
            path.pop();
        }
    }
}

/// log₂ of a coordinate (of at least 10⁻¹², so 0 has one).
fn log(v: f64) -> f64 {
    v.max(1e-12).log2()
}

impl Grid {
    /// The `k` points (of positive latency) nearest `logq` in log₂ space,
    /// as (distance, index) — the `k` least in (distance, index) order, so
    /// equally distant points are taken in table order.
    ///
    /// Points are visited outwards from `logq`'s coordinate on the sorting
    /// axis, and the walk stops once that coordinate alone puts the points
    /// left farther than the `k`-th found: a distance is at least any one
    /// axis's term (a sum of non-negative terms only grows, and so does its
    /// root, in floating point too), so no skipped point could rank. The
    /// result is exactly a scan of every point's.
    fn nearest(&self, logq: &[f64], k: usize) -> Vec<(f64, usize)> {
        let d = self.dims;
        let dist = |i: usize| {
            self.logs[i * d..(i + 1) * d].iter().zip(logq).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt()
        };
        let (axis, order) = (self.by_axis.0, &self.by_axis.1);
        let bound = |x: f64| ((x - logq[axis]) * (x - logq[axis])).sqrt();
        let less = |a: &(f64, usize), b: &(f64, usize)| a.0 < b.0 || (a.0 == b.0 && a.1 < b.1);
        let mut ranked: Vec<(f64, usize)> = Vec::with_capacity(k + 1);
        let split = order.partition_point(|p| p.0 < logq[axis]);
        let (mut lo, mut hi) = (split, split);
        loop {
            let kth = if ranked.len() < k { f64::INFINITY } else { ranked[k - 1].0 };
            let left = (lo > 0).then(|| bound(order[lo - 1].0));
            let right = (hi < order.len()).then(|| bound(order[hi].0));
            let take_left = match (left, right) {
                (None, None) => break,
                (Some(l), Some(r)) => l <= r,
                (l, _) => l.is_some(),
            };
            let b = if take_left { left } else { right }.expect("a side with points");
            if b > kth {
                break; // the nearer side is already too far, so is the other
            }
            let i = if take_left {
                lo -= 1;
                order[lo].1
            } else {
                hi += 1;
                order[hi - 1].1
            };
            let e = (dist(i), i);
            if ranked.len() < k || less(&e, &ranked[k - 1]) {
                let at = ranked.partition_point(|x| less(x, &e));
                ranked.insert(at, e);
                ranked.truncate(k);
            }
        }
        ranked
    }

    /// The utilisation of the points nearest `q`, held at `q`.
    fn hold(&self, q: &[f64], sol: &dyn Fn(&[f64]) -> f64) -> f64 {
        const NEAREST: usize = 4;
        let d = self.dims;
        if q.len() != d || d == 0 {
            return f64::NAN;
        }
        let logq: Vec<f64> = q.iter().map(|&v| log(v)).collect();
        let ranked = self.nearest(&logq, NEAREST + 1);
        let ranked: Vec<(f64, f64)> = ranked
            .into_iter()
            .map(|(dist, i)| (dist, sol(&self.coords[i * d..(i + 1) * d]) / self.latency[i]))
            .filter(|x| x.1 > 0.0)
            .collect();
        let r = ranked.get(NEAREST).map_or(f64::INFINITY, |x| x.0);
        let picked = &ranked[..ranked.len().min(NEAREST)];
        let weight = |d: f64| {
            if r.is_infinite() { 1.0 / (d * d + 1e-12) } else { ((r - d).max(0.0) / (r * d + 1e-12)).powi(2) }
        };
        let mut total: f64 = picked.iter().map(|x| weight(x.0)).sum();
        let mut util: f64 = picked.iter().map(|x| weight(x.0) * x.1).sum();
        if total <= 0.0 {
            total = picked.len() as f64;
            util = picked.iter().map(|x| x.1).sum();
        }
        sol(q) / (util / total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pruned_nearest_points_are_exactly_those_of_a_full_scan() {
        // The scan the hold used to make: every point, ties in table order.
        fn scan(g: &Grid, logq: &[f64], k: usize) -> Vec<(f64, usize)> {
            let d = g.dims;
            let mut ranked: Vec<(f64, usize)> = Vec::new();
            for i in 0..g.latency.len() {
                if g.latency[i] <= 0.0 {
                    continue;
                }
                let dist =
                    g.logs[i * d..(i + 1) * d].iter().zip(logq).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
                if ranked.len() < k || dist < ranked[k - 1].0 {
                    let at = ranked.partition_point(|x| x.0 <= dist);
                    ranked.insert(at, (dist, i));
                    ranked.truncate(k);
                }
            }
            ranked
        }
        // A ragged 3-axis grid on powers of two (many equal distances), some latencies 0.
        let mut root = Node::default();
        let mut x = 12345u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..600 {
            let (a, b, c) = (1 << (next() % 7), 1 << (next() % 9), 1 << (next() % 12));
            let v = if next() % 10 == 0 { 0.0 } else { (next() % 1000) as f64 + 1.0 };
            root.insert(&[a, b, c], v);
        }
        let g = Grid::new(root);
        for _ in 0..2000 {
            let q = [(next() % 300) as f64 + 0.5, (next() % 600) as f64, (1u64 << (next() % 14)) as f64];
            let logq: Vec<f64> = q.iter().map(|&v| log(v)).collect();
            for k in [1, 5, 9] {
                assert_eq!(g.nearest(&logq, k), scan(&g, &logq, k), "{q:?}, k = {k}");
            }
        }
    }

    fn unit(_: &[f64]) -> f64 {
        1.0
    }

    #[test]
    fn a_grid_hits_exactly_blends_inside_and_holds_utilisation_outside() {
        let mut root = Node::default();
        // Two axes: (a, s) → latency; s blended in square roots.
        for (a, s, v) in [(1, 1, 1.0), (1, 9, 9.0), (3, 1, 3.0), (3, 9, 27.0)] {
            root.insert(&[a, s], v);
        }
        root.insert(&[1, 1], 100.0); // a duplicate: the first row wins
        let g = Grid::new(root);
        assert_eq!(g.query(&[1.0, 9.0], &unit, Some(1)), 9.0);
        assert_eq!(g.query(&[1.0, 1.0], &unit, Some(1)), 1.0);
        // a = 2: linear between 1 and 3 at s = 1 → 2.
        assert_eq!(g.query(&[2.0, 1.0], &unit, Some(1)), 2.0);
        // s = 5 at a = 1: √ blend (1 + (3 − 1)·0.5)² = 4.
        assert!((g.query(&[1.0, 5.0], &unit, Some(1)) - 4.0).abs() < 1e-12);
        // Outside, with sol = s²: the nearest points' utilisation s²/latency is held.
        let sol = |p: &[f64]| p[1] * p[1];
        // Utilisations 1/1, 81/9, 1/3, 81/27 at log₂ distances 4.170, 1, 4.461, 1.874 from
        // (1, 18); four points, so weights 1/d²: utilisation 9.92845 / 1.39249 = 7.12997,
        // latency 18² / 7.12997 = 45.4418.
        let v = g.query(&[1.0, 18.0], &sol, Some(1));
        assert!((v - 45.441_811_236_310_46).abs() < 1e-9, "{v}");
    }
}
