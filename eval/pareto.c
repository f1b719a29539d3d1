// eval/pareto.c — the Pareto frontier: a point is on it when no other point dominates it, i.e.
// is at least as good on both axes and strictly better on one. O(n^2): a sweep has tens of points.
#include "pareto.h"

#include <math.h>

// 1 if a dominates b
static int dominates(const pareto_point *a, const pareto_point *b) {
    return a->x >= b->x && a->y >= b->y && (a->x > b->x || a->y > b->y);
}

int pareto_frontier(const pareto_point *p, int n, int *on) {
    int count = 0;
    for (int i = 0; i < n; i++) {
        on[i] = !isnan(p[i].x) && !isnan(p[i].y);
        for (int j = 0; j < n && on[i]; j++)
            if (j != i && !isnan(p[j].x) && !isnan(p[j].y) && dominates(&p[j], &p[i])) on[i] = 0;
        count += on[i];
    }
    return count;
}
