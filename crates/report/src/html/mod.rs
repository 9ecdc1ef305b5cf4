//! The single-file HTML report of any stored run: inline CSS and inline SVG charts, nothing to
//! fetch and no script, so it opens offline. It shows the cross-checks first, as passed, warned
//! or failed in colour and in words, then the charts and tables, then the run's manifest.

mod ab;
mod bisect;
mod layout;
mod manifest;
pub mod opdiff;
mod profile;
mod sweep;
mod waste;

use crate::svg::bar_chart_svg;
use crate::view::RunView;

/// The HTML report of any run.
pub fn html(view: &RunView) -> Result<String, String> {
    Ok(match view {
        RunView::Profile(v) => profile::profile_html(v),
        RunView::Sweep(v) => sweep::sweep_html(v)?,
        RunView::Ab(v) => ab::ab_html(v),
        RunView::Waste(v) => waste::waste_html(v),
        RunView::Bisect(v) => bisect::bisect_html(v),
        other => {
            return Err(format!(
                "{} {} run has no HTML page",
                crate::render::article(other.kind()),
                other.kind()
            ))
        }
    })
}

/// The chart of any run as a standalone SVG file.
pub fn chart_svg(view: &RunView) -> Result<String, String> {
    Ok(match view {
        RunView::Profile(v) => bar_chart_svg(&profile::profile_chart(v)),
        RunView::Sweep(v) => crate::sweep::sweep_svg(
            &crate::sweep::sweep_chart_title(v.manifest, &v.summary),
            &v.summary,
        )?,
        RunView::Ab(v) => bar_chart_svg(&ab::ab_chart(v)),
        RunView::Waste(v) => bar_chart_svg(&waste::waste_chart(v)),
        other => {
            return Err(format!(
                "{} {} run has no chart",
                crate::render::article(other.kind()),
                other.kind()
            ))
        }
    })
}
