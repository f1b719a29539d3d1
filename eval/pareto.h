// eval/pareto.h — the Pareto frontier of points scored on two axes, more being better on both
// (`sift sweep`: speedup against fidelity to `full`).
#pragma once

typedef struct pareto_point {
    double x, y;   // sift sweep: x = speedup over full, y = fidelity
} pareto_point;

// on[i] = 1 when no other point of p (n,) is at least as good on both axes and better on one,
// else 0. Equal points do not dominate each other (both stay on the frontier); a point with a
// NaN coordinate is never on it and dominates nothing. Returns the number of points on it.
int pareto_frontier(const pareto_point *p, int n, int *on);
