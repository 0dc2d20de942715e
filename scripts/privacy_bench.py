"""Benchmark: the error that client-level differential privacy costs (docs/PRIVACY.md).

Usage: ``python scripts/privacy_bench.py [--M 10000,100000] [--repeats 5] [--big]
[--clip C] [--json FILE]`` (``--big`` adds M = 10^6 with 2 repeats and ``data.val_N=0``;
about 8 GB).

For each M it runs ``system=synthetic eps=0 strategy=centralized_exact`` (every other setting
the system's default, ``data.val_N=0`` so that only training data are drawn) three ways and
prints the mean over repeats of the final relative parameter error ``e_R``:

- **plain**: without privacy;
- **fnsysid**: ``privacy=central privacy.epsilon=1 privacy.delta=1e-5`` (each client's
  statistics clipped together, Gaussian noise projected onto the statistics' space,
  eigenvalue floor; fnsysid/learning/privacy.py);
- **baseline** (written here, independent of fnsysid's mechanism): each sample's row
  ``z_t = (phi_t, y_t)`` clipped to norm ``ROW_CLIP``, so that one client (at most ``N T``
  samples) moves the augmented Gram ``sum z_t z_t^T`` by at most ``N T ROW_CLIP^2`` in
  Frobenius norm; symmetric Gaussian noise with the analytic Gaussian mechanism's sigma
  (Balle and Wang 2018, ``dp_accounting.get_sigma_gaussian``) for (1, 1e-5); the features'
  Gram's eigenvalues raised to ``sqrt(2 n_phi) sigma``; ``Theta^T = F^-1 Phi^T Y``. It reads
  the same training samples (``generate`` with the run's seed, client blocks at a time).

The plain pooled least squares of those samples is checked against the plain run's estimate
(same data), so the baseline is compared on the run's own data.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: the baseline's bound on one sample's row (phi_t, y_t): with the synthetic system's
#: defaults ||phi_t||^2 is about 3.5 and ||y_t||^2 about 8, so most rows are kept whole
ROW_CLIP = 4.0
EPSILON, DELTA = 1.0, 1e-5
BLOCK = 20_000          # clients generated at a time for the baseline


def run(overrides):
    from fnsysid.app.api import run as fnsysid_run

    return fnsysid_run(["progress=false", "output.plot=false", *overrides])


def baseline(M: int, repeats: int, settings, model, theta_plain, rng) -> np.ndarray:
    """Relative errors (repeats,) of the row-clipping baseline on the run's training data."""
    import dp_accounting

    from fnsysid.dynamics.model import generate

    s = settings
    n_phi = model.structure.shape[1]
    n_y = model.structure.shape[0]
    d = n_phi + n_y
    A = np.zeros((repeats, d, d))           # clipped augmented Gram
    A_plain = np.zeros((repeats, d, d))
    truth = None
    for lo in range(0, M, BLOCK):
        part = generate(model, M, s.N, s.T, s.eps, repeats, s.seed, keep_samples=True,
                        clients=range(lo, min(M, lo + BLOCK)))
        Z = np.concatenate([part.Phi, part.Y], axis=-1) * part.mask[..., None]   # (S, m, n, d)
        norms = np.linalg.norm(Z, axis=-1, keepdims=True)
        Zc = Z * np.minimum(1.0, ROW_CLIP / np.maximum(norms, 1e-300))
        A += np.einsum("smni,smnj->sij", Zc, Zc)
        A_plain += np.einsum("smni,smnj->sij", Z, Z)
        if truth is None:
            truth = part.theta_true[:, 0]
    n_max = int(np.max(s.N)) * s.T
    sigma = dp_accounting.get_sigma_gaussian(EPSILON, DELTA) * n_max * ROW_CLIP ** 2
    g = rng.standard_normal(A.shape)
    A_noisy = A + sigma * 0.5 * (g + np.swapaxes(g, -1, -2))

    def solve(Aug, floor):
        F, C = Aug[:, :n_phi, :n_phi], Aug[:, :n_phi, n_phi:]
        lam, V = np.linalg.eigh(F)
        lam = np.maximum(lam, floor)
        Theta_T = np.einsum("spk,sk,sqk,sqj->spj", V, 1.0 / lam, V, C)
        return np.swapaxes(Theta_T, -1, -2).reshape(repeats, -1)       # theta row by row

    check = solve(A_plain, 0.0)
    gap = np.abs(check - theta_plain).max()
    if gap > 1e-8 * np.abs(theta_plain).max():
        raise SystemExit(f"baseline data differ from the run's: plain estimates {gap:.3g} apart")
    theta = solve(A_noisy, np.sqrt(2.0 * n_phi) * sigma)
    return np.linalg.norm(theta - truth, axis=-1) / np.linalg.norm(truth, axis=-1)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--M", default="10000,100000")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--big", action="store_true", help="also M = 10^6 with 2 repeats")
    ap.add_argument("--clip", type=float, default=None,
                    help="privacy.clip (default: the privacy group's default)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    cases = [(int(m), args.repeats) for m in args.M.split(",")]
    if args.big:
        cases.append((1_000_000, 2))
    rows = []
    print(f"{'M':>8} {'S':>2} {'plain':>9} {'fnsysid':>9} {'ratio':>6} {'baseline':>9} "
          f"{'ratio':>6} {'z':>5} {'clipped':>7} {'s':>6}")
    for M, S in cases:
        t0 = time.perf_counter()
        base = ["system=synthetic", "eps=0", "strategy=centralized_exact", f"M={M}",
                f"repeats={S}", "data.val_N=0"]
        plain = run(base)
        clip = [] if args.clip is None else [f"privacy.clip={args.clip:g}"]
        priv = run([*base, "privacy=central", f"privacy.epsilon={EPSILON}",
                    f"privacy.delta={DELTA}", *clip])
        e_plain = float(plain.summary["final_e_max_mean"])
        e_priv = float(priv.summary["final_e_max_mean"])
        e_base = baseline(M, S, plain.settings, plain.model, plain.estimate[:, 0],
                          np.random.default_rng(12345))
        p = priv.summary["privacy"]
        row = dict(M=M, repeats=S, plain=e_plain, fnsysid=e_priv, baseline=float(e_base.mean()),
                   ratio=e_priv / e_plain, baseline_ratio=float(e_base.mean()) / e_plain,
                   noise_multiplier=p["noise_multiplier"], epsilon=p["epsilon"],
                   clipped_fraction=p["clipped_fraction"], seconds=time.perf_counter() - t0)
        rows.append(row)
        print(f"{M:>8} {S:>2} {e_plain:>9.3g} {e_priv:>9.3g} {row['ratio']:>6.2f} "
              f"{row['baseline']:>9.3g} {row['baseline_ratio']:>6.2f} "
              f"{p['noise_multiplier']:>5.2f} {p['clipped_fraction']:>7.2f} "
              f"{row['seconds']:>6.1f}", flush=True)
    out = {"epsilon": EPSILON, "delta": DELTA, "row_clip": ROW_CLIP, "clip": args.clip,
           "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
