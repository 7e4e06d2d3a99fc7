"""Charts drawn on the server as SVG: no JavaScript library, nothing to fetch, works offline.

One line per series over the chart's window, a y axis from zero to the
largest value (100 for percentages), the window's ends on the x axis. Every
label is escaped: series are named after models and shards, which operators
and agents name.
"""

from django.utils.html import format_html
from django.utils.safestring import mark_safe

from fleet.services.charts import Chart
from fleet.services.units import bytes_text

WIDTH, HEIGHT = 600, 160
LEFT, RIGHT, TOP, BOTTOM = 64, 8, 8, 20
# Enough colours to tell a node's models apart; past them they repeat.
PALETTE = ("#2c7be5", "#e5632c", "#2ca05a", "#9b59b6", "#c0392b", "#16a2b8", "#b8860b", "#555")


def value_text(value: float, unit: str) -> str:
    if unit == "percent":
        return f"{value:.0f}%"
    if unit == "bytes":
        return bytes_text(value)
    if unit == "cores":
        return f"{value:.2f}"
    if value >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.2f}"


def render(chart: Chart, start: float, end: float) -> str:
    """The chart as an SVG element (safe to put in a page), with its legend after it."""
    ymax = 100.0 if chart.unit == "percent" else 0.0
    for s in chart.series:
        for _, v in s.points:
            ymax = max(ymax, v)
    # Headroom, so a flat line at the top is not drawn on the frame.
    ymax = ymax * 1.1 if chart.unit != "percent" else ymax
    ymax = ymax or 1.0
    span = max(1.0, end - start)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def xy(t: float, v: float) -> str:
        x = LEFT + plot_w * min(1.0, max(0.0, (t - start) / span))
        y = TOP + plot_h * (1 - min(1.0, max(0.0, v / ymax)))
        return f"{x:.1f},{y:.1f}"

    parts = [
        *_frame(chart.title, plot_w, plot_h),
        format_html(
            '<text class="axis" x="{}" y="{}" text-anchor="end">{}</text>',
            LEFT - 4,
            TOP + 10,
            value_text(ymax, chart.unit),
        ),
        format_html(
            '<text class="axis" x="{}" y="{}" text-anchor="end">0</text>', LEFT - 4, TOP + plot_h
        ),
        format_html(
            '<text class="axis" x="{}" y="{}">-{} min</text>',
            LEFT,
            HEIGHT - 4,
            round(span / 60),
        ),
        format_html(
            '<text class="axis" x="{}" y="{}" text-anchor="end">now</text>',
            WIDTH - RIGHT,
            HEIGHT - 4,
        ),
    ]
    for i, s in enumerate(chart.series):
        colour = PALETTE[i % len(PALETTE)]
        pts = sorted(s.points)
        if len(pts) == 1:
            x, y = xy(*pts[0]).split(",")
            parts.append(
                format_html(
                    '<circle class="series" data-series="{}" data-points="1" cx="{}" cy="{}" '
                    'r="2.5" fill="{}"><title>{}</title></circle>',
                    s.label,
                    x,
                    y,
                    colour,
                    s.label,
                )
            )
        elif pts:
            parts.append(
                format_html(
                    '<polyline class="series" data-series="{}" data-points="{}" points="{}" '
                    'fill="none" stroke="{}" stroke-width="1.5"><title>{}</title></polyline>',
                    s.label,
                    len(pts),
                    " ".join(xy(t, v) for t, v in pts),
                    colour,
                    s.label,
                )
            )
    parts.append(mark_safe("</svg>"))
    legend = [mark_safe('<ul class="legend">')]
    for i, s in enumerate(chart.series):
        last = value_text(sorted(s.points)[-1][1], chart.unit) if s.points else "no data"
        legend.append(
            format_html(
                '<li><span class="swatch" style="background:{}"></span>{} <span class="last">{}'
                "</span></li>",
                PALETTE[i % len(PALETTE)],
                s.label,
                last,
            )
        )
    if not chart.series:
        legend.append(mark_safe('<li class="none">no data</li>'))
    legend.append(mark_safe("</ul>"))
    return mark_safe("".join(str(p) for p in parts + legend))


# The idle no replica held: grey, apart from every team's colour.
IDLE_COLOUR = "#b0b0b0"
BAR_MAX = 48.0  # a bar's width: a short period is not a wall of colour


def stacked_bars(chart, series_label=lambda s: s) -> str:
    """A cost chart (``services.console.costs.CostChart``) as an SVG of one bar a day,
    stacked per team in the chart's order with the idle on top, then its legend with each
    series' total over the period. ``series_label`` names a series for people."""
    from fleet.services.console.costs import IDLE

    days = chart.days
    top = max((float(d.total) for d in days), default=0.0) * 1.1 or 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(1, len(days))
    bar_w = min(BAR_MAX, max(1.0, slot * 0.8))
    colour = {
        s: IDLE_COLOUR if s == IDLE else PALETTE[i % len(PALETTE)]
        for i, s in enumerate(chart.series)
    }
    parts = [
        *_frame(f"cost a day, {chart.currency}", plot_w, plot_h),
        format_html(
            '<text class="axis" x="{}" y="{}" text-anchor="end">{} {}</text>',
            LEFT - 4,
            TOP + 10,
            f"{top:,.0f}" if top >= 10 else f"{top:.2f}",
            chart.currency,
        ),
        format_html(
            '<text class="axis" x="{}" y="{}" text-anchor="end">0</text>', LEFT - 4, TOP + plot_h
        ),
    ]
    if days:
        parts.append(
            format_html(
                '<text class="axis" x="{}" y="{}">{}</text>', LEFT, HEIGHT - 4, f"{days[0].day}"
            )
        )
    if len(days) > 1:
        parts.append(
            format_html(
                '<text class="axis" x="{}" y="{}" text-anchor="end">{}</text>',
                WIDTH - RIGHT,
                HEIGHT - 4,
                f"{days[-1].day}",
            )
        )
    for i, d in enumerate(days):
        x = LEFT + i * slot + (slot - bar_w) / 2
        y = TOP + plot_h
        for who, cost in d.parts:
            if not cost:
                continue
            h = plot_h * float(cost) / top
            y -= h
            parts.append(
                format_html(
                    '<rect class="segment{}" data-series="{}" data-day="{}" data-cost="{}" '
                    'x="{}" y="{}" width="{}" height="{}" fill="{}">'
                    "<title>{} {}: {} {}</title></rect>",
                    " idle" if who == IDLE else "",
                    who,
                    d.day.isoformat(),
                    f"{cost:.2f}",
                    f"{x:.1f}",
                    f"{y:.1f}",
                    f"{bar_w:.1f}",
                    f"{h:.1f}",
                    colour[who],
                    d.day.isoformat(),
                    series_label(who),
                    f"{cost:,.2f}",
                    chart.currency,
                )
            )
    parts.append(mark_safe("</svg>"))
    legend = [mark_safe('<ul class="legend">')]
    for s in chart.series:
        total = sum((c for d in days for who, c in d.parts if who == s), start=0)
        legend.append(
            format_html(
                '<li data-series="{}"><span class="swatch" style="background:{}"></span>{} '
                '<span class="last">{} {}</span></li>',
                s,
                colour[s],
                series_label(s),
                f"{total:,.2f}",
                chart.currency,
            )
        )
    if not chart.series:
        legend.append(mark_safe('<li class="none">no costs counted</li>'))
    legend.append(mark_safe("</ul>"))
    return mark_safe("".join(str(p) for p in parts + legend))


def _frame(label: str, plot_w: float, plot_h: float) -> list[str]:
    """A chart's opening: the SVG element, named for screen readers, and its plot area."""
    return [
        format_html(
            '<svg class="chart-svg" viewBox="0 0 {} {}" width="{}" height="{}" role="img" '
            'aria-label="{}">',
            WIDTH,
            HEIGHT,
            WIDTH,
            HEIGHT,
            label,
        ),
        format_html(
            '<rect class="plot" x="{}" y="{}" width="{}" height="{}"></rect>',
            LEFT,
            TOP,
            plot_w,
            plot_h,
        ),
    ]
