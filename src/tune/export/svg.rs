//! `--export-svg`: a bar chart of median throughput per configuration with
//! min-max whiskers, the winner in another colour (plotters' SVG backend).

use plotters::prelude::*;

use crate::export::{ExportError, Exporter};
use crate::tune::TuneReport;

pub(super) struct Svg;

impl Exporter<TuneReport> for Svg {
    fn render(&self, r: &TuneReport, _: &()) -> Result<String, ExportError> {
        let mut out = String::new();
        let rows: Vec<(String, f64, f64, f64, bool)> = r
            .configs
            .iter()
            .filter_map(|c| {
                let s = c.throughput?;
                Some((c.name.clone(), s.median, s.min, s.max, r.is_winner(c)))
            })
            .collect();
        {
            let width = 160 + 110 * rows.len().max(1) as u32;
            let root = SVGBackend::with_string(&mut out, (width, 420)).into_drawing_area();
            draw(&root, r, &rows).map_err(ExportError::Svg)?;
            root.present()
                .map_err(|e| ExportError::Svg(e.to_string()))?;
        }
        Ok(out)
    }
}

type Row = (String, f64, f64, f64, bool);

fn draw<'a>(
    root: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    r: &TuneReport,
    rows: &[Row],
) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let top = rows.iter().map(|x| x.3).fold(0.0, f64::max).max(1e-9) * 1.15;
    let n = rows.len().max(1);
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!("throughput ({}), median with min-max", r.unit),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((0..n).into_segmented(), 0.0..top)
        .map_err(|x| e(&x))?;
    let names: Vec<String> = rows.iter().map(|x| x.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc(r.unit.clone())
        .draw()
        .map_err(|x| e(&x))?;
    for (i, (_, med, lo, hi, win)) in rows.iter().enumerate() {
        let colour = if *win {
            RGBColor(46, 139, 87)
        } else {
            RGBColor(70, 110, 180)
        };
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), *med),
            ],
            colour.filled(),
        );
        bar.set_margin(0, 0, 14, 14);
        chart.draw_series(std::iter::once(bar)).map_err(|x| e(&x))?;
        let whisker = BLACK.stroke_width(2);
        let c = SegmentValue::CenterOf(i);
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(c.clone(), *lo), (c, *hi)],
                whisker,
            )))
            .map_err(|x| e(&x))?;
    }
    Ok(())
}
