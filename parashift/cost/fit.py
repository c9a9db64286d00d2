"""Fits of timed points to the profile's terms, apart from any device (so they are tested
with recorded numbers).

A kernel family is timed at several sizes. Its points bound by bytes give a (robust) line
seconds = launch + bytes / (hbm x bw_eff): the intercept is the family's fixed cost, the
slope its bandwidth. Its points bound by FLOPs give flops_eff from the slope of
(seconds - launch) over FLOPs. A point bound by bytes never sets flops_eff (the first H200
profile did, and priced decode attention of a GQA model as bound by FLOPs it never reaches).
Host work is a line too: seconds = per step + sequences x per sequence."""
import statistics
from dataclasses import dataclass

from parashift.cost.profile import Roofline


@dataclass(frozen=True)
class Line:
    intercept: float
    slope: float


def robust_line(xs: list[float], ys: list[float]) -> Line:
    """The Theil-Sen line through (x, y): the median of the slopes between pairs of points,
    the median intercept at that slope (a point a busy host slowed moves neither); one
    distinct x: through the origin."""
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"a fit needs as many x as y, and some: {len(xs)} x, {len(ys)} y")
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs))
              for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    if not slopes:
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        return Line(0.0, my / mx) if mx else Line(my, 0.0)
    slope = statistics.median(slopes)
    return Line(statistics.median(y - slope * x for x, y in zip(xs, ys)), slope)


def bytes_line(points: list[tuple[float, float]], hbm_bytes_per_s: float,
               reads_only: bool = False) -> tuple[float, float]:
    """(launch seconds, bw_eff) of points (bytes, seconds) bound by bytes; the intercept
    kept >= 0 and the efficiency in (0, 1] (a kernel never beats the measured copy), unless
    `reads_only`: a kernel that only reads its bytes (a GEMV's weights) may stream them
    faster than a copy that reads and writes them."""
    line = robust_line([b for b, _ in points], [s for _, s in points])
    if line.slope <= 0:
        raise ValueError(f"seconds do not grow with bytes over {points}: time more sizes")
    launch = max(line.intercept, 0.0)
    if line.intercept < 0:  # refit the slope through the origin
        line = Line(0.0, sum(b * s for b, s in points) / sum(b * b for b, _ in points))
    bw_eff = 1.0 / (line.slope * hbm_bytes_per_s)
    return launch, bw_eff if reads_only else min(1.0, bw_eff)


def flops_eff(points: list[tuple[float, float]], matmul_flops: float, launch_s: float) -> float:
    """flops_eff of points (FLOPs, seconds) bound by FLOPs, their fixed cost `launch_s` off:
    the slope through the origin of (seconds - launch) over FLOPs, in (0, 1]."""
    num = sum(f * (s - launch_s) for f, s in points)
    den = sum(f * f for f, _ in points)
    if num <= 0 or den <= 0:
        raise ValueError(f"no FLOPs-bound time left over the launch {launch_s} in {points}")
    return min(1.0, den / num / matmul_flops)


def flops_line(points: list[tuple[float, float]], matmul_flops: float) -> tuple[float, float]:
    """(launch seconds, flops_eff) of points (FLOPs, seconds) bound by FLOPs."""
    line = robust_line([f for f, _ in points], [s for _, s in points])
    if line.slope <= 0:
        raise ValueError(f"seconds do not grow with FLOPs over {points}: time more sizes")
    return max(line.intercept, 0.0), min(1.0, 1.0 / (line.slope * matmul_flops))


def roofline(bytes_points: list[tuple[float, float]], flops_points: list[tuple[float, float]],
             hbm_bytes_per_s: float, matmul_flops: float, launch_scale: float = 1.0
             ) -> Roofline:
    """A family's roofline: launch and bw_eff from its bytes-bound points, flops_eff from
    its FLOPs-bound ones; `launch_scale`: kernels of this family one use of it launches."""
    launch, bw = bytes_line(bytes_points, hbm_bytes_per_s)
    fe = flops_eff(flops_points, matmul_flops, launch) if flops_points else 1.0
    return Roofline(bw, fe, launch * launch_scale)


def host_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(per step, per sequence) seconds of host work from (sequences, seconds) points; both
    kept >= 0 (a step's host work does not shrink with its sequences)."""
    line = robust_line([float(b) for b, _ in points], [s for _, s in points])
    if line.slope < 0:
        return max(sum(s for _, s in points) / len(points), 0.0), 0.0
    if line.intercept < 0:
        return 0.0, sum(b * s for b, s in points) / sum(b * b for b, _ in points)
    return line.intercept, line.slope
