//! The report's plot: admitted requests per window, stacked by region, against the limit and
//! the demand, with the faults, outages and impostors shaded and every agreement measurement
//! marked.

use plotters::prelude::*;

use crate::checks::WindowRow;
use crate::cluster::REGIONS;
use crate::record::IntervalKind;
use crate::report::Report;

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 500;
/// Width of the legend beside the plot.
const LEGEND_WIDTH: u32 = 170;
/// eu, us, ap.
const REGION_COLORS: [RGBColor; 3] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];
const LIMIT_COLOR: RGBColor = RGBColor(200, 0, 0);
const DEMAND_COLOR: RGBColor = RGBColor(110, 110, 110);

fn interval_color(kind: IntervalKind) -> RGBColor {
    match kind {
        IntervalKind::Fault => RGBColor(255, 150, 0),
        IntervalKind::Down => RGBColor(90, 90, 90),
        IntervalKind::Impostor => RGBColor(214, 39, 40),
        IntervalKind::Skew => RGBColor(23, 190, 207),
    }
}

/// The SVG of a report.
pub fn render(report: &Report) -> Result<String, String> {
    let mut svg = String::new();
    draw(report, &mut svg).map_err(|e| format!("plot: {e}"))?;
    Ok(svg)
}

/// `value` of every window as a step: flat over the window.
fn steps(windows: &[WindowRow], w: f64, value: impl Fn(&WindowRow) -> u64) -> Vec<(f64, f64)> {
    windows
        .iter()
        .flat_map(|r| {
            let s = r.start_ms as f64 / 1_000.0;
            let v = value(r) as f64;
            [(s, v), (s + w, v)]
        })
        .collect()
}

fn draw(report: &Report, svg: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::with_string(svg, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let verdict = if report.passed {
        "every check held".to_owned()
    } else {
        format!("FAILED: {}", report.failed_checks().join(", "))
    };
    let root = root.titled(
        &format!("{}: {} ({verdict})", report.scenario, report.summary),
        ("sans-serif", 16),
    )?;
    let (plot_area, legend_area) = root.split_horizontally(WIDTH - LEGEND_WIDTH);
    let limit = report.setup.limit as f64;
    let w = report.setup.window_ms as f64 / 1_000.0;
    let load_s = report.setup.load_ms as f64 / 1_000.0;
    let windows = &report.windows;
    let x0 = windows
        .first()
        .map_or(0.0, |r| r.start_ms as f64 / 1_000.0)
        .min(0.0);
    let x1 = windows
        .last()
        .map_or(load_s, |r| r.start_ms as f64 / 1_000.0 + w)
        .max(load_s);
    let top = windows
        .iter()
        .map(|r| r.admitted_total.max(r.sent.iter().sum()))
        .max()
        .unwrap_or(0) as f64;
    let y1 = (limit * 1.6).max(top * 1.12);
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(x0..x1, 0.0..y1)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the load started (ticks at window boundaries)")
        .y_desc(format!("requests per {} ms window", report.setup.window_ms))
        .x_labels(((x1 - x0) / w).round() as usize + 1)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(225, 225, 225))
        .draw()?;

    // Faults, outages, impostors, skew: shaded, labelled at the top (a label is kept inside
    // the plot: about 6.5 px per character).
    let plot_px = f64::from(WIDTH - LEGEND_WIDTH - 80);
    let per_char = 6.5 * (x1 - x0) / plot_px;
    for (k, iv) in report.intervals.iter().enumerate() {
        let color = interval_color(iv.kind);
        let s = (iv.start_ms as f64 / 1_000.0).max(x0);
        let e = iv.end_ms.map_or(x1, |e| e as f64 / 1_000.0).min(x1);
        chart.draw_series(std::iter::once(Rectangle::new(
            [(s, 0.0), (e, y1)],
            color.mix(0.15).filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            iv.label.clone(),
            (
                (s + 0.05)
                    .min(x1 - per_char * iv.label.len() as f64)
                    .max(x0),
                y1 * (0.975 - 0.045 * (k % 3) as f64),
            ),
            ("sans-serif", 12).into_font().color(&color),
        )))?;
    }

    // Admissions, stacked: eu at the bottom, then us, then ap; the top is the total.
    for row in windows {
        let s = row.start_ms as f64 / 1_000.0;
        let mut lower = 0.0;
        for (r, color) in REGION_COLORS.iter().enumerate() {
            let upper = lower + row.admitted[r] as f64;
            chart.draw_series(std::iter::once(Rectangle::new(
                [(s, lower), (s + w, upper)],
                color.mix(0.6).filled(),
            )))?;
            lower = upper;
        }
    }
    chart.draw_series(LineSeries::new(
        steps(windows, w, |row| row.admitted_total),
        BLACK.stroke_width(1),
    ))?;

    // Demand and the limit.
    chart.draw_series(DashedLineSeries::new(
        steps(windows, w, |row| row.sent.iter().sum()),
        5,
        4,
        DEMAND_COLOR.stroke_width(1),
    ))?;
    chart.draw_series(LineSeries::new(
        vec![(x0, limit), (x1, limit)],
        LIMIT_COLOR.stroke_width(2),
    ))?;

    // Agreement measurements after heals.
    if let Some(f) = &report.figures {
        for a in f.agreements.iter().filter(|a| a.label != "final") {
            let x = a.at_ms as f64 / 1_000.0;
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x, limit), (x, y1 * 0.84)],
                BLACK.stroke_width(1),
            )))?;
            let text = match a.agreed_ms {
                Some(ms) => format!("{}: views agree after {ms} ms", a.label),
                None => format!("{}: views never agree", a.label),
            };
            let len = text.len() as f64;
            chart.draw_series(std::iter::once(Text::new(
                text,
                ((x + 0.05).min(x1 - per_char * len), y1 * 0.82),
                ("sans-serif", 12).into_font().color(&BLACK),
            )))?;
        }
    }

    // The legend, beside the plot.
    enum Swatch {
        Line(RGBColor, u32),
        Patch(RGBAColor),
    }
    let mut entries = vec![
        (
            Swatch::Line(LIMIT_COLOR, 2),
            format!("limit {}", report.setup.limit),
        ),
        (Swatch::Line(DEMAND_COLOR, 1), "demand, all regions".into()),
        (Swatch::Line(BLACK, 1), "admitted, all regions".into()),
    ];
    for r in (0..REGIONS.len()).rev() {
        entries.push((
            Swatch::Patch(REGION_COLORS[r].mix(0.6)),
            format!("admitted in {}", REGIONS[r]),
        ));
    }
    for (kind, name) in [
        (IntervalKind::Fault, "network fault"),
        (IntervalKind::Down, "node down"),
        (IntervalKind::Impostor, "impostor running"),
        (IntervalKind::Skew, "skewed clock"),
    ] {
        if report.intervals.iter().any(|i| i.kind == kind) {
            entries.push((Swatch::Patch(interval_color(kind).mix(0.15)), name.into()));
        }
    }
    for (k, (swatch, text)) in entries.into_iter().enumerate() {
        let y = 30 + 20 * k as i32;
        match swatch {
            Swatch::Line(color, width) => legend_area.draw(&PathElement::new(
                vec![(6, y), (26, y)],
                color.stroke_width(width),
            ))?,
            Swatch::Patch(color) => {
                legend_area.draw(&Rectangle::new([(6, y - 6), (26, y + 6)], color.filled()))?
            }
        }
        legend_area.draw(&Text::new(
            text,
            (32, y - 6),
            ("sans-serif", 12).into_font().color(&BLACK),
        ))?;
    }
    root.present()?;
    Ok(())
}
