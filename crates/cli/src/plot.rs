//! `--plot`: training loss and train/valid/test accuracy per epoch, as a PNG (plotters with
//! the bundled DejaVu Sans, so no system fonts are needed).

use std::path::Path;

use grinnder_engine::EpochMetrics;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// A curve: its legend, colour and the figure it plots.
type Series = (&'static str, RGBColor, fn(&EpochMetrics) -> Option<f64>);

/// Refuses, before the run, a `--plot` path whose type cannot be drawn (the curves are PNG).
pub fn check_path(path: &Path) -> anyhow::Result<()> {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    anyhow::ensure!(
        ext.as_deref() == Some("png"),
        "--plot {}: the curves are drawn as PNG; give a file name ending in .png",
        path.display()
    );
    Ok(())
}

/// Draws the loss and accuracy curves of `history` into `path`.
pub fn curves(path: &Path, title: &str, history: &[EpochMetrics]) -> anyhow::Result<()> {
    anyhow::ensure!(!history.is_empty(), "no evaluated epoch to plot");
    register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow::anyhow!("cannot load the bundled font"))?;
    let root = BitMapBackend::new(path, (1100, 450)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(550);
    let last = history.last().map_or(1, |m| m.epoch + 1) as f64;
    let max_loss = history.iter().map(|m| m.loss).fold(0.0, f64::max).max(1e-9) * 1.05;
    let mut c = ChartBuilder::on(&left)
        .caption(format!("{title}: training loss"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..last, 0.0..max_loss)?;
    c.configure_mesh()
        .x_desc("epoch")
        .y_desc("loss")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .label_style(("sans-serif", 13))
        .draw()?;
    c.draw_series(LineSeries::new(history.iter().map(|m| (m.epoch as f64, m.loss)), &RED))?;
    let mut c = ChartBuilder::on(&right)
        .caption(format!("{title}: accuracy"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..last, 0.0..1.0)?;
    c.configure_mesh()
        .x_desc("epoch")
        .y_desc("accuracy")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .label_style(("sans-serif", 13))
        .draw()?;
    let series: [Series; 3] = [
        ("train", BLUE, |m| m.train_acc),
        ("valid", GREEN, |m| m.valid_acc),
        ("test", BLACK, |m| m.test_acc),
    ];
    for (name, color, f) in series {
        c.draw_series(LineSeries::new(history.iter().filter_map(|m| Some((m.epoch as f64, f(m)?))), color))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    root.present()?;
    Ok(())
}

/// One run of a scaling plot: its series, its GPU (or rank) count and its seconds per epoch.
pub struct ScalingPoint {
    pub series: String,
    pub gpus: usize,
    pub epoch_s: f64,
}

/// Speed-up over each series' one-GPU run against the GPU count, with the ideal line.
pub fn scaling(path: &Path, title: &str, points: &[ScalingPoint]) -> anyhow::Result<()> {
    let mut series: Vec<&str> = points.iter().map(|p| p.series.as_str()).collect();
    series.dedup();
    series.sort_unstable();
    series.dedup();
    let base = |s: &str| points.iter().find(|p| p.series == s && p.gpus == 1).map(|p| p.epoch_s);
    for s in &series {
        anyhow::ensure!(base(s).is_some(), "series {s:?} has no one-GPU run to compare with");
    }
    register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow::anyhow!("cannot load the bundled font"))?;
    let max_gpus = points.iter().map(|p| p.gpus).max().unwrap_or(1).max(2) as f64;
    let max_speedup =
        points.iter().map(|p| base(&p.series).unwrap_or(p.epoch_s) / p.epoch_s).fold(max_gpus, f64::max)
            * 1.05;
    let root = BitMapBackend::new(path, (700, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut c = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.5..max_gpus + 0.5, 0.0..max_speedup)?;
    c.configure_mesh()
        .x_desc("GPUs")
        .y_desc("speed-up over one GPU")
        .x_labels(max_gpus as usize * 2 + 1)
        .x_label_formatter(&|x| if (x - x.round()).abs() < 1e-9 { format!("{x:.0}") } else { String::new() })
        .label_style(("sans-serif", 13))
        .draw()?;
    c.draw_series(LineSeries::new([(1.0, 1.0), (max_gpus, max_gpus)], BLACK.mix(0.3)))?
        .label("ideal")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.mix(0.3)));
    for (i, s) in series.iter().enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        let b = base(s).expect("checked above");
        let mut pts: Vec<(f64, f64)> =
            points.iter().filter(|p| p.series == *s).map(|p| (p.gpus as f64, b / p.epoch_s)).collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        c.draw_series(LineSeries::new(pts.clone(), colour.stroke_width(2)))?
            .label(*s)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], colour.stroke_width(2)));
        c.draw_series(pts.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
    }
    c.configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    root.present()?;
    Ok(())
}
