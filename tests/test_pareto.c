// tests/test_pareto.c — the Pareto frontier of `sift sweep` on hand-made point sets: a single
// point, a dominated point, ties on one axis, exact duplicates, NaN points, and a staircase.
#include <math.h>
#include <string.h>

#include "../eval/pareto.h"
#include "check.h"

// The frontier of p (n <= 16) as a string of 0/1, e.g. "101".
static const char *frontier(const pareto_point *p, int n, int *count) {
    static char s[17];
    int on[16];
    *count = pareto_frontier(p, n, on);
    for (int i = 0; i < n; i++) s[i] = on[i] ? '1' : '0';
    s[n] = 0;
    return s;
}

int main(void) {
    int c;
    pareto_point one[] = {{1.5, 0.2}};
    CHECK(strcmp(frontier(one, 1, &c), "1") == 0 && c == 1, "a single point is the frontier");
    CHECK(pareto_frontier(one, 0, NULL) == 0, "no points, no frontier");

    // (2, 0.5) is beaten on both axes by (3, 0.9)
    pareto_point dom[] = {{1, 1}, {2, 0.5}, {3, 0.9}};
    CHECK(strcmp(frontier(dom, 3, &c), "101") == 0 && c == 2, "got %s", frontier(dom, 3, &c));

    // same speed, lower fidelity: dominated; same fidelity, lower speed: dominated
    pareto_point ties[] = {{2, 0.8}, {2, 0.7}, {1, 0.8}, {1, 1.0}};
    CHECK(strcmp(frontier(ties, 4, &c), "1001") == 0 && c == 2, "got %s", frontier(ties, 4, &c));

    // exact duplicates dominate neither each other; both stay (or both go)
    pareto_point dup[] = {{2, 0.8}, {2, 0.8}, {1, 0.5}};
    CHECK(strcmp(frontier(dup, 3, &c), "110") == 0 && c == 2, "got %s", frontier(dup, 3, &c));
    pareto_point dup_beaten[] = {{2, 0.8}, {2, 0.8}, {2.5, 0.8}};
    CHECK(strcmp(frontier(dup_beaten, 3, &c), "001") == 0 && c == 1, "got %s",
          frontier(dup_beaten, 3, &c));

    // NaN (no figure measured) is never on the frontier and hides nothing
    pareto_point nan_pts[] = {{NAN, 1.0}, {1, 0.5}, {2, NAN}};
    CHECK(strcmp(frontier(nan_pts, 3, &c), "010") == 0 && c == 1, "got %s", frontier(nan_pts, 3, &c));

    // a staircase: full (1, 1), then faster and less faithful settings, one below the stairs
    pareto_point stairs[] = {{1, 1}, {1.5, 0.95}, {2, 0.9}, {3, 0.5}, {1.8, 0.85}, {0.9, 1}};
    CHECK(strcmp(frontier(stairs, 6, &c), "111100") == 0 && c == 4, "got %s",
          frontier(stairs, 6, &c));
    return check_summary("test_pareto");
}
