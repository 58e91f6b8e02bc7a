"""One MILP call to HiGHS that keeps the dual bound when the time limit ends a search without a solution.

`scipy.optimize.milp` drops HiGHS's `mip_dual_bound` whenever no feasible solution was found
before the time limit, so a model that may be infeasible (the capped staircase pieces) would
report no bound at all. Where scipy bundles its HiGHS bindings (`scipy.optimize._highspy`, scipy
>= 1.15), the model goes to HiGHS directly and the bound is read from its info; elsewhere
`scipy.optimize.milp` runs as before. HiGHS 1.12 prints a debug line
("HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();") straight to file
descriptor 1 in some solves, which would break `--json` output (one JSON object on stdout), so the
solve runs with descriptor 1 pointed at /dev/null.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_matrix

try:
    import scipy.optimize._highspy._core as _core  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - older scipy
    _core = None


@contextmanager
def _stdout_silenced():
    """File descriptor 1 goes to /dev/null inside the block (C-level prints included)."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def solve_milp(c: np.ndarray, matrix: csr_matrix, lower: np.ndarray, upper: np.ndarray, integrality: np.ndarray,
               col_upper: np.ndarray, time_limit_s: float | None, initial: np.ndarray | None = None) -> SimpleNamespace:
    """min c x with lower <= matrix x <= upper, 0 <= x <= col_upper, x integer where integrality is 1.
    Returns status (0 optimal, 1 time limit, 2 infeasible), x and fun (None without a solution),
    mip_dual_bound (a lower bound on the optimum; finite also without a solution). `initial`: a
    feasible x HiGHS starts from (its first incumbent; ignored without the direct bindings)."""
    if _core is None:
        options = {"disp": False, "mip_rel_gap": 0.0}
        if time_limit_s is not None:
            options["time_limit"] = max(0.1, float(time_limit_s))
        result = milp(c, constraints=LinearConstraint(matrix, lower, upper), integrality=integrality,
                      bounds=Bounds(np.zeros(c.size), col_upper), options=options)
        status = {0: 0, 2: 2}.get(result.status, 1)
        return SimpleNamespace(status=status, x=result.x, fun=result.fun,
                               mip_dual_bound=getattr(result, "mip_dual_bound", None))
    columns = matrix.tocsc()
    lp = _core.HighsLp()
    lp.num_col_, lp.num_row_ = c.size, matrix.shape[0]
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = c.size, matrix.shape[0]
    lp.a_matrix_.format_ = _core.MatrixFormat.kColwise
    lp.col_cost_ = np.asarray(c, dtype=float)
    lp.col_lower_ = np.zeros(c.size)
    lp.col_upper_ = np.asarray(col_upper, dtype=float)
    lp.row_lower_ = np.asarray(lower, dtype=float)
    lp.row_upper_ = np.asarray(upper, dtype=float)
    lp.a_matrix_.start_ = columns.indptr
    lp.a_matrix_.index_ = columns.indices
    lp.a_matrix_.value_ = columns.data
    lp.integrality_ = [_core.HighsVarType(int(i)) for i in integrality]
    highs = _core._Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("log_to_console", False)
    highs.setOptionValue("mip_rel_gap", 0.0)
    if time_limit_s is not None:
        highs.setOptionValue("time_limit", max(0.1, float(time_limit_s)))
    highs.passModel(lp)
    if initial is not None:
        start = _core.HighsSolution()
        start.col_value = [float(v) for v in initial]
        start.value_valid = True
        highs.setSolution(start)
    with _stdout_silenced():
        highs.run()
    model_status = highs.getModelStatus()
    info = highs.getInfo()
    states = _core.HighsModelStatus
    if model_status == states.kOptimal:
        status = 0
    elif model_status in (states.kInfeasible, states.kUnboundedOrInfeasible):
        status = 2  # our objectives are >= 0 on x >= 0, so never unbounded
    else:
        status = 1
    x = fun = None
    if status != 2 and np.isfinite(info.objective_function_value) and info.primal_solution_status == 2:
        x = np.array(highs.getSolution().col_value)
        fun = float(info.objective_function_value)
    if status == 0 and x is None:
        status = 1
    return SimpleNamespace(status=status, x=x, fun=fun, mip_dual_bound=float(info.mip_dual_bound))
