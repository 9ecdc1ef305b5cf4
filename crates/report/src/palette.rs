//! The one palette: the colour of every band (fixed by name, so charts of different runs match)
//! and the few colours charts give to things that are not bands. Every chart, table swatch and
//! DOT graph colours a band through [`band_rgb`] / [`band_colour`].

use plotters::style::RGBColor;

/// Colours of the bands, fixed by name so charts of different runs match.
pub fn band_rgb(band: &str) -> RGBColor {
    match band {
        "attention" => RGBColor(0xe4, 0x57, 0x2e),
        "linear_attention" => RGBColor(0x29, 0x33, 0x5c),
        "projections" => RGBColor(0xf3, 0xa7, 0x12),
        "moe" => RGBColor(0x66, 0x9b, 0xbc),
        "dense_ffn" => RGBColor(0x7b, 0x5e, 0xa7),
        "other" => RGBColor(0x8a, 0xa6, 0x6f),
        "network" => RGBColor(0x2a, 0x9d, 0x8f),
        _ => RGBColor(0x99, 0x99, 0x99),
    }
}

/// `#rrggbb` of a band's colour, the same as the sweep chart's.
pub fn band_colour(band: &str) -> String {
    let c = band_rgb(band);
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

/// The colours of the two sides of an A/B.
pub const SIDE_A: &str = "#7a8ca3";
pub const SIDE_B: &str = "#e4572e";

/// The two clocks of an imported trace with device activity: the host's spans and the
/// device's activity, the same in every chart.
pub const HOST_CLOCK: &str = "#9aa5b1";
pub const DEVICE_CLOCK: &str = "#0969da";

/// A waste chart's bars: a band's whole time and the part of it on rows nobody reads.
pub const WASTED: &str = "#c0392b";
pub const WHOLE: &str = "#9aa5b1";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_band_colour_is_its_rgb_in_hex() {
        assert_eq!(band_colour("attention"), "#e4572e");
        assert_eq!(band_colour("moe"), "#669bbc");
        assert_eq!(band_colour("a band no rule names"), "#999999");
    }
}
