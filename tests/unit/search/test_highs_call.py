"""search/highs.py: the direct HiGHS call agrees with scipy.optimize.milp and reports infeasibility."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_matrix

from geotrain.search.highs import solve_milp


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6), st.integers(1, 4))
def test_direct_call_matches_scipy_milp_on_random_covering_problems(seed, n, m):
    rng = np.random.default_rng(seed)
    c = rng.uniform(0.1, 3.0, n)
    a = rng.integers(0, 4, (m, n)).astype(float)
    a[:, rng.integers(0, n)] += 1.0  # every row can be covered
    lower = rng.uniform(1.0, 6.0, m)
    integrality = rng.integers(0, 2, n).astype(float)
    col_upper = np.full(n, 10.0)
    ours = solve_milp(c, csr_matrix(a), lower, np.full(m, np.inf), integrality, col_upper, 10.0)
    reference = milp(c, constraints=LinearConstraint(a, lower, np.inf), integrality=integrality,
                     bounds=Bounds(np.zeros(n), col_upper), options={"mip_rel_gap": 0.0})
    assert ours.status == 0 and reference.status == 0
    assert ours.fun == pytest.approx(reference.fun, rel=1e-7, abs=1e-9)
    assert ours.mip_dual_bound <= ours.fun * (1 + 1e-7) + 1e-9
    assert (a @ ours.x >= lower - 1e-6).all()


def test_direct_call_reports_an_infeasible_integer_model():
    # 2 x = 1 with x integer in [0, 3]
    result = solve_milp(np.array([1.0]), csr_matrix(np.array([[2.0]])), np.array([1.0]), np.array([1.0]),
                        np.array([1.0]), np.array([3.0]), 5.0)
    assert result.status == 2 and result.x is None


def test_solver_output_never_reaches_stdout(capfd):
    rng = np.random.default_rng(5)
    n, m = 12, 6
    a = rng.integers(0, 4, (m, n)).astype(float) + 1.0
    print("before", flush=True)
    solve_milp(rng.uniform(0.1, 3.0, n), csr_matrix(a), np.full(m, 7.5), np.full(m, np.inf), np.ones(n),
               np.full(n, 10.0), 5.0)
    print("after", flush=True)
    assert capfd.readouterr().out == "before\nafter\n"
