//! The benchmarks' line plots as standalone SVG (no plotting crate: a few polylines on axes),
//! so that BENCHMARKS.md shows them on any Markdown viewer.

/// One line of a plot.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub color: &'static str,
    pub dashed: bool,
    /// (x, y), in any order.
    pub points: Vec<(f64, f64)>,
}

/// What the plot says around its lines.
#[derive(Debug, Clone)]
pub struct Axes<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// A log scale on x: table sizes and watch counts grow by factors.
    pub log_x: bool,
}

const LEFT: f64 = 70.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 50.0;

/// `series` on axes from 0 (y) and the smallest x to the largest, a tick at every x a series has,
/// the legend to the right in the order given.
pub fn lines(axes: &Axes, series: &[Series], width: f64, height: f64) -> String {
    let (w, h) = (width, height);
    let all = || series.iter().flat_map(|s| s.points.iter().copied());
    let max_y = all().map(|p| p.1).fold(0.0, f64::max) * 1.15;
    let (min_x, max_x) = all().fold((f64::MAX, f64::MIN), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    let scale = |v: f64| if axes.log_x { v.max(f64::MIN_POSITIVE).log10() } else { v };
    let x = |v: f64| {
        LEFT + (scale(v) - scale(min_x)) / (scale(max_x) - scale(min_x)).max(1e-9) * (w - LEFT - RIGHT)
    };
    let y = |v: f64| h - BOTTOM - v / max_y.max(1e-9) * (h - TOP - BOTTOM);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{LEFT}\" y=\"18\" font-size=\"14\">{}</text>\n",
        escape(axes.title)
    );
    svg += &format!(
        "<line x1=\"{LEFT}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - BOTTOM,
        w - RIGHT,
        h - BOTTOM
    );
    svg +=
        &format!("<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{}\" stroke=\"black\"/>\n", h - BOTTOM);
    for i in 0..=5 {
        let v = max_y * f64::from(i) / 5.0;
        svg += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
            LEFT - 6.0,
            y(v) + 4.0,
            tick(v)
        );
    }
    let mut xs: Vec<f64> = all().map(|p| p.0).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    for v in xs {
        svg += &format!(
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{v:.0}</text>\n",
            x(v),
            h - BOTTOM + 18.0
        );
    }
    svg += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
        (LEFT + w - RIGHT) / 2.0,
        h - 10.0,
        escape(axes.x_label)
    );
    svg += &format!(
        "<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">{}</text>\n",
        (TOP + h - BOTTOM) / 2.0,
        (TOP + h - BOTTOM) / 2.0,
        escape(axes.y_label)
    );
    let mut legend = 0.0;
    for s in series.iter().filter(|s| !s.points.is_empty()) {
        let mut line = s.points.clone();
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
        let dash = if s.dashed { " stroke-dasharray=\"6 4\"" } else { "" };
        let color = s.color;
        let d: Vec<String> = line.iter().map(|(gx, gy)| format!("{:.1},{:.1}", x(*gx), y(*gy))).collect();
        svg += &format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash}/>\n",
            d.join(" ")
        );
        for (gx, gy) in &line {
            svg += &format!("<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>\n", x(*gx), y(*gy));
        }
        let ly = TOP + 10.0 + legend * 18.0;
        svg += &format!(
            "<line x1=\"{}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"2\"{dash}/>\n",
            w - RIGHT + 15.0,
            w - RIGHT + 45.0
        );
        svg += &format!("<text x=\"{}\" y=\"{}\">{}</text>\n", w - RIGHT + 50.0, ly + 4.0, escape(&s.label));
        legend += 1.0;
    }
    svg + "</svg>\n"
}

/// Whole numbers above 10, one decimal below: a y axis of 0–3 µs must not read 0, 1, 1, 2, 2, 3.
fn tick(v: f64) -> String {
    if v >= 10.0 || v == 0.0 { format!("{v:.0}") } else { format!("{v:.1}") }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axes(log_x: bool) -> Axes<'static> {
        Axes { title: "t <1>", x_label: "x", y_label: "y", log_x }
    }

    fn series(points: Vec<(f64, f64)>) -> Series {
        Series { label: "a & b".into(), color: "#888888", dashed: false, points }
    }

    #[test]
    fn points_span_the_plot_area_and_text_is_escaped() {
        let svg = lines(&axes(false), &[series(vec![(10.0, 0.0), (0.0, 0.0)])], 720.0, 420.0);
        // Sorted by x: the smallest at the left edge, the largest at the right one, y = 0 on the axis.
        assert!(svg.contains("<polyline points=\"70.0,370.0 530.0,370.0\""), "{svg}");
        assert!(svg.contains(">t &lt;1&gt;<") && svg.contains(">a &amp; b<"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    }

    #[test]
    fn a_log_scale_puts_each_factor_of_ten_equally_apart() {
        let svg = lines(
            &axes(true),
            &[series(vec![(1_000.0, 1.0), (10_000.0, 1.0), (100_000.0, 1.0)])],
            720.0,
            420.0,
        );
        let y = 370.0 - 1.0 / 1.15 * 340.0;
        assert!(svg.contains(&format!("70.0,{y:.1} 300.0,{y:.1} 530.0,{y:.1}")), "{svg}");
        // The highest point stays below the top: the y axis runs to 1.15 × the largest value.
        assert!(svg.contains(">0.2</text>"));
    }

    #[test]
    fn empty_series_are_left_out_of_the_legend() {
        let svg = lines(&axes(false), &[series(vec![(1.0, 2.0)]), series(Vec::new())], 720.0, 420.0);
        assert_eq!(svg.matches("<polyline").count(), 1);
        assert_eq!(svg.matches(">a &amp; b<").count(), 1);
    }
}
