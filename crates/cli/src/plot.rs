//! `--plot`: training loss and train/valid/test accuracy per epoch, as a PNG (plotters with
//! the bundled DejaVu Sans, so no system fonts are needed).

use std::path::Path;

use grinnder_engine::EpochMetrics;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// A curve: its legend, colour and the figure it plots.
type Series = (&'static str, RGBColor, fn(&EpochMetrics) -> Option<f64>);

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
