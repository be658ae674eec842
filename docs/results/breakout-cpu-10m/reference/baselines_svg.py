"""The Breakout curves of openai/baselines' Atari 10M benchmark page at frame marks.

    git -C baselines show ea25b9e8b234e6ee1bca43083f8f3cf974143998:benchmarks_atari10M.htm > page.htm
    python baselines_svg.py page.htm

The page draws each game as an SVG plot (matplotlib's): a curve is a path of exact coordinates,
so its value at a mark is interpolated between two of them, not read by eye. The axes come from
the plot's white grid lines: vertical at 0.0 ... 1.0 x 1e7 timesteps, horizontal at rewards 0,
200, 400. A timestep is an agent step after frame skip 4, so frames = 4 x timesteps. Prints
the grid, then per curve (by colour; the page's table gives ppo2 the colour rgb(102, 194, 165),
#66c2a5) its number of points and its reward at each mark (None: past the curve's last point).
"""

import re
import sys

s = open(sys.argv[1]).read()
i = s.find(">Breakout</text>")
svg = s[s.rfind("<svg", 0, i) : s.find("</svg>", i)]
# the grid: white lines, vertical at the x ticks (0.0 ... 1.0 x 1e7 timesteps), horizontal at 0, 200, 400
grid = re.findall(
    r'd="M ([-\d.]+) ([-\d.]+) \nL ([-\d.]+) ([-\d.]+) \n" style="fill:none;stroke:#ffffff;stroke-linecap:round;', svg
)
xt = sorted(float(a) for a, b, c, d in grid if a == c)
yt = sorted(float(b) for a, b, c, d in grid if b == d)
print("x grid", xt, "(0.0 to 1.0e7 timesteps)")
print("y grid", yt, "(400, 200, 0 reward)")
paths = re.findall(r'<path clip-path="[^"]*" d="([^"]*)"[^>]*style="([^"]*)"', svg)
x0, x1 = xt[0], xt[-1]  # 0.0 and 1.0e7 timesteps
y0, y200 = yt[-1], yt[-2]  # reward 0 and 200 (svg y grows downwards)


def at(pts, steps):
    """The curve's reward at ``steps`` timesteps (None: past its last point)."""
    px = x0 + (x1 - x0) * steps / 1e7
    for (ax, ay), (bx, by) in zip(pts, pts[1:]):
        if ax <= px <= bx:
            py = ay + (by - ay) * (px - ax) / (bx - ax)
            return (y0 - py) / (y0 - y200) * 200
    return None


for d, style in paths:
    colour = re.search(r"stroke:(#[0-9a-f]{6})", style)
    pts = [(float(a), float(b)) for a, b in re.findall(r"[ML] ([-\d.]+) ([-\d.]+)", d)]
    if not colour or len(pts) < 20:
        continue
    marks = {f"{f // 10**6}M frames": at(pts, f / 4) for f in (1e6, 2e6, 3e6, 5e6, 10e6, 20e6, 40e6)}
    print(colour.group(1), len(pts), {k: None if v is None else round(v, 1) for k, v in marks.items()})
