#!/usr/bin/env python3
"""The critical value of the steady-state trend test (src/metrics/steady.rs,
`TREND_T`), derived by Monte Carlo under the null of a stable queue.

A run is `unstable` when, over its second half, the queue wait and the
number of requests each arrival finds in the system both rise: a
least-squares line through 10 group means of 5-request batches, whose slope
t statistic exceeds the critical value, with a fitted rise of more than a
quarter of the level. Near saturation the group means are autocorrelated,
so Student's t with 8 degrees of freedom (2.896 at 1 %) calls a stable
M/D/1 queue unstable in 4-6 % of 2,000-request runs at rho = 0.9. This
script simulates stable M/D/1 queues (Lindley's recursion; Poisson
arrivals, service D) at rho 0.5-0.9 and 1,000-10,000 requests, computes
the test's statistic (the smaller of the two series' t, when both rise
materially) and prints its 99th percentile per cell: the critical value is
the largest of them, rounded up, so that a stable queue is called unstable
in at most 1 % of runs at every run length from 1,000 requests up to
rho = 0.9.

    pip install numpy && python3 scripts/steady-threshold.py [seeds]
"""
import sys

import numpy as np

D = 0.010  # service time, s (any: the statistic is scale-free)
GROUPS, BATCH, RISE = 10, 5, 0.25


def md1(rho, n, rng):
    """Waits and numbers in system at arrival of n M/D/1 customers."""
    gaps = rng.exponential(D / rho, n)
    w = np.empty(n)
    w[0] = 0.0
    for i in range(1, n):
        w[i] = max(0.0, w[i - 1] + D - gaps[i])
    arrive = np.cumsum(gaps)
    depart = arrive + w + D
    in_system = np.arange(n) - np.searchsorted(depart, arrive, side="right")
    return w, in_system.astype(float)


def trend_t(x):
    """The slope's t over the second half, or -1e9 without a material rise."""
    k = len(x) // BATCH
    half = x[: k * BATCH].reshape(k, BATCH).mean(1)[k // 2 :]
    y = np.array([half[i * len(half) // GROUPS : (i + 1) * len(half) // GROUPS].mean() for i in range(GROUPS)])
    xs = np.arange(GROUPS) - (GROUPS - 1) / 2
    slope = (xs * (y - y.mean())).sum() / (xs**2).sum()
    resid = y - y.mean() - slope * xs
    se = np.sqrt((resid**2).sum() / (GROUPS - 2) / (xs**2).sum())
    if slope * (GROUPS - 1) <= RISE * abs(y.mean()):
        return -1e9
    return slope / se if se > 0 else 1e9


def main():
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rng = np.random.default_rng(2026)
    worst = 0.0
    print(f"99th percentile of the trend statistic, {seeds} stable M/D/1 runs per cell")
    print("rho    " + "".join(f"{n:>9}" for n in (1000, 1500, 2000, 4000, 10000)))
    for rho in (0.5, 0.7, 0.8, 0.9):
        row = []
        for n in (1000, 1500, 2000, 4000, 10000):
            t = [min(trend_t(w + D), trend_t(s)) for w, s in (md1(rho, n, rng) for _ in range(seeds))]
            q = float(np.quantile(t, 0.99))
            worst = max(worst, q)
            row.append(f"{q:9.2f}" if q > -1e8 else f"{'-':>9}")
        print(f"{rho:<7}" + "".join(row))
    print(f"largest: {worst:.2f} -> critical value {np.ceil(worst * 10) / 10:.1f}")


if __name__ == "__main__":
    main()
