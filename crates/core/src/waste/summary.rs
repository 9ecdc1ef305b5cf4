//! The waste summary of a stored profile: every node's unread share of its TIMED time, and the
//! ms/token figures of the chunk, each band, each layer and each node by the profile's
//! estimator.

use std::collections::BTreeMap;

use super::{
    needs, Kept, KeptCounts, NodeNeed, NodeWaste, OpCount, Treatment, WasteBandRow, WasteError,
    WasteLayerRow, WasteSummary, WASTE_SCHEMA_VERSION,
};
use crate::band::Assignment;
use crate::node::effective_layers;
use crate::profile::{membership, node_medians_us, per_cycle_ms_per_token, ProfileRaw};
use crate::stats::Sample;

/// Summarises the waste of a stored profile: `assignments[i]` is the band of `raw.graph[i]`,
/// `needs` what [`needs`] found for it; bands are listed in `band_order`, then any other band the
/// assignments name.
pub fn summarise(
    raw: &ProfileRaw,
    assignments: &[Assignment],
    needs: &[NodeNeed],
    band_order: &[&str],
) -> Result<WasteSummary, WasteError> {
    validate(raw, assignments, needs)?;
    let tokens = raw.config.work.chunk_tokens;
    let t = Timings::new(raw, needs, tokens.max(1) as f64);
    let total_us: f64 = t.medians.iter().sum();
    let fused = Sample::new(&t.walls)
        .map_err(|_| WasteError::BadSample("fused_ms".into()))?
        .median();
    let whole_ms = t.point(&|_| 1.0)?;
    let share = |ms: f64| if whole_ms > 0.0 { ms / whole_ms } else { 0.0 };
    let per_cycle = t.estimate(&|i| t.unneeded[i])?;
    let layers_of = effective_layers(&raw.graph);
    let bands = band_rows(&t, assignments, band_order, &share)?;
    let layers = layer_rows(&t, &layers_of, &share)?;
    let nodes = node_rows(&t, raw, assignments, needs, &layers_of)?;
    let wasted_total: f64 = t.wasted_us.iter().sum();
    let wasted_share = share(per_cycle.median());
    Ok(WasteSummary {
        schema_version: WASTE_SCHEMA_VERSION,
        tokens,
        depth_tokens: raw.config.work.depth_tokens,
        logits: if raw.config.work.all_logits {
            "all"
        } else {
            "last"
        }
        .into(),
        cycles: raw.cycles.len() as u32,
        fused_ms: fused,
        ms_per_token: whole_ms,
        timed_sum_ms: total_us / 1e3,
        wasted_timed_ms: wasted_total / 1e3,
        wasted_share,
        wasted_ms_per_token: per_cycle.median(),
        wasted_ms_per_token_min: per_cycle.min(),
        wasted_ms_per_token_max: per_cycle.max(),
        wasted_share_of_minimums: wasted_share_of_minimums(raw, &t.unneeded),
        gain_if_trimmed: if wasted_share < 1.0 {
            1.0 / (1.0 - wasted_share) - 1.0
        } else {
            f64::INFINITY
        },
        kept: kept_counts(raw, needs),
        bands,
        layers,
        nodes,
        unknown_ops: unknown_ops(raw, needs, &t.medians),
        source_run: None,
    })
}

/// Refuses a profile without cycles, with assignments or needs of another graph, or with a
/// cycle that timed another number of nodes than the graph holds.
fn validate(
    raw: &ProfileRaw,
    assignments: &[Assignment],
    needs: &[NodeNeed],
) -> Result<(), WasteError> {
    let n = raw.graph.len();
    if raw.cycles.is_empty() {
        return Err(WasteError::NoCycles);
    }
    if assignments.len() != n || needs.len() != n {
        return Err(WasteError::Assignments(
            assignments.len().min(needs.len()),
            n,
        ));
    }
    for (cycle, c) in raw.cycles.iter().enumerate() {
        if c.node_us.len() != n {
            return Err(WasteError::NodeCount {
                cycle,
                found: c.node_us.len(),
                expected: n,
            });
        }
    }
    Ok(())
}

/// Every node's timings and unread share, and the one estimator (as the profile's) of every
/// ms/token figure: the median of its per-cycle values (the part's share of that cycle's TIMED
/// sum x that cycle's FUSED wall / tokens), their min..max the range; a share is a point over
/// the point it is a share of.
struct Timings<'a> {
    /// Per cycle, every node's TIMED time.
    times: Vec<&'a [f64]>,
    /// Per cycle, the FUSED wall.
    walls: Vec<f64>,
    tok: f64,
    /// Every node's median TIMED time over the cycles.
    medians: Vec<f64>,
    /// Every node's share of rows nobody reads.
    unneeded: Vec<f64>,
    /// Every node's median x its unread share.
    wasted_us: Vec<f64>,
}

impl<'a> Timings<'a> {
    fn new(raw: &'a ProfileRaw, needs: &[NodeNeed], tok: f64) -> Timings<'a> {
        let medians = node_medians_us(raw);
        let unneeded: Vec<f64> = needs.iter().map(|d| 1.0 - d.needed_fraction()).collect();
        let wasted_us = (0..raw.graph.len())
            .map(|i| medians[i] * unneeded[i])
            .collect();
        Timings {
            times: raw.cycles.iter().map(|c| c.node_us.as_slice()).collect(),
            walls: raw.cycles.iter().map(|c| c.fused_ms).collect(),
            tok,
            medians,
            unneeded,
            wasted_us,
        }
    }

    fn estimate(&self, weight: &dyn Fn(usize) -> f64) -> Result<Sample, WasteError> {
        Sample::new(&per_cycle_ms_per_token(
            &self.times,
            &self.walls,
            self.tok,
            weight,
        ))
        .map_err(|_| WasteError::BadSample("ms/token".into()))
    }

    fn point(&self, weight: &dyn Fn(usize) -> f64) -> Result<f64, WasteError> {
        self.estimate(weight).map(|s| s.median())
    }

    /// (ms/token, wasted ms/token, nodes with waste) of a group of nodes.
    fn group(&self, member: &dyn Fn(usize) -> bool) -> Result<(f64, f64, u32), WasteError> {
        let all = self.point(&membership(member))?;
        let wasted = self.point(&|i| if member(i) { self.unneeded[i] } else { 0.0 })?;
        let count = (0..self.medians.len())
            .filter(|&i| member(i) && self.wasted_us[i] > 0.0)
            .count() as u32;
        Ok((all, wasted, count))
    }
}

/// The wasted share from each node's fastest TIMED time over the cycles.
fn wasted_share_of_minimums(raw: &ProfileRaw, unneeded: &[f64]) -> f64 {
    let n = raw.graph.len();
    let minimums: Vec<f64> = (0..n)
        .map(|i| {
            raw.cycles
                .iter()
                .map(|c| c.node_us[i])
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    let min_total: f64 = minimums.iter().sum();
    if min_total > 0.0 {
        (0..n).map(|i| minimums[i] * unneeded[i]).sum::<f64>() / min_total
    } else {
        0.0
    }
}

/// Every band: those of `band_order`, then any other the assignments name.
fn band_rows(
    t: &Timings<'_>,
    assignments: &[Assignment],
    band_order: &[&str],
    share: &dyn Fn(f64) -> f64,
) -> Result<Vec<WasteBandRow>, WasteError> {
    let mut band_order: Vec<&str> = band_order.to_vec();
    for a in assignments {
        if !band_order.contains(&a.band.as_str()) {
            band_order.push(&a.band);
        }
    }
    band_order
        .iter()
        .map(|&band| {
            let (all, wasted, nodes) = t.group(&|i| assignments[i].band == band)?;
            Ok(WasteBandRow {
                band: band.to_string(),
                ms_per_token: all,
                wasted_ms_per_token: wasted,
                wasted_share_of_band: if all > 0.0 { wasted / all } else { 0.0 },
                wasted_share: share(wasted),
                nodes,
            })
        })
        .collect()
}

/// The layers with waste, in layer order (nodes outside layers last).
fn layer_rows(
    t: &Timings<'_>,
    layers_of: &[Option<u32>],
    share: &dyn Fn(f64) -> f64,
) -> Result<Vec<WasteLayerRow>, WasteError> {
    let mut layer_keys: Vec<Option<u32>> = layers_of.to_vec();
    layer_keys.sort_by_key(|l| (l.is_none(), *l));
    layer_keys.dedup();
    let mut layers = Vec::new();
    for layer in layer_keys {
        let (all, wasted, nodes) = t.group(&|i| layers_of[i] == layer)?;
        if wasted > 0.0 {
            layers.push(WasteLayerRow {
                layer,
                ms_per_token: all,
                wasted_ms_per_token: wasted,
                wasted_share_of_layer: if all > 0.0 { wasted / all } else { 0.0 },
                wasted_share: share(wasted),
                nodes,
            });
        }
    }
    Ok(layers)
}

/// The nodes with waste, most first.
fn node_rows(
    t: &Timings<'_>,
    raw: &ProfileRaw,
    assignments: &[Assignment],
    needs: &[NodeNeed],
    layers_of: &[Option<u32>],
) -> Result<Vec<NodeWaste>, WasteError> {
    let n = raw.graph.len();
    let mut nodes: Vec<NodeWaste> = Vec::new();
    for i in (0..n).filter(|&i| t.wasted_us[i] > 0.0) {
        let g = &raw.graph[i];
        nodes.push(NodeWaste {
            index: g.index,
            op: g.op.clone(),
            name: g.name.clone(),
            layer: layers_of[i],
            band: assignments[i].band.clone(),
            treatment: needs[i].treatment,
            rows: needs[i].rows,
            needed_rows: needs[i].needed,
            median_us: t.medians[i],
            wasted_us: t.wasted_us[i],
            wasted_ms_per_token: t.point(&|j| if j == i { t.unneeded[i] } else { 0.0 })?,
        });
    }
    nodes.sort_by(|a, b| {
        b.wasted_us
            .total_cmp(&a.wasted_us)
            .then(a.index.cmp(&b.index))
    });
    Ok(nodes)
}

/// The ops no rule knows, with their nodes and median TIMED ms.
fn unknown_ops(raw: &ProfileRaw, needs: &[NodeNeed], medians: &[f64]) -> Vec<OpCount> {
    let mut unknown: BTreeMap<String, OpCount> = BTreeMap::new();
    for (i, g) in raw.graph.iter().enumerate() {
        if needs[i].treatment == Treatment::Unknown {
            let e = unknown.entry(g.op.clone()).or_insert(OpCount {
                op: g.op.clone(),
                nodes: 0,
                timed_ms: 0.0,
            });
            e.nodes += 1;
            e.timed_ms += medians[i] / 1e3;
        }
    }
    unknown.into_values().collect()
}

/// What the graph keeps: logits, cache writes, other sinks.
fn kept_counts(raw: &ProfileRaw, needs: &[NodeNeed]) -> KeptCounts {
    let kept_of = |k: Kept| needs.iter().filter(move |d| d.kept == Some(k));
    KeptCounts {
        logits_nodes: kept_of(Kept::Logits).count() as u32,
        logits_rows: kept_of(Kept::Logits).map(|d| d.rows).sum(),
        cache_writes: kept_of(Kept::CacheWrite).count() as u32,
        other_sinks: (0..raw.graph.len())
            .filter(|&i| needs[i].kept == Some(Kept::OtherSink))
            .map(|i| raw.graph[i].name.clone())
            .collect(),
    }
}

/// Categorises the graph of a stored profile, finds the needed rows and summarises the waste:
/// what `waste` does after measuring or from a stored run.
pub fn analyse(
    raw: &ProfileRaw,
    rules: &crate::band::BandRules,
    arch: &crate::arch::ArchInfo,
) -> Result<(Vec<Assignment>, Vec<NodeNeed>, WasteSummary), WasteError> {
    let cat = crate::band::Categoriser::new(rules, arch);
    let assignments = cat.categorise(&raw.graph);
    let needs = needs(&raw.graph, &raw.config.work);
    let bands = rules.bands_in(&assignments);
    let band_order: Vec<&str> = bands.iter().map(String::as_str).collect();
    let summary = summarise(raw, &assignments, &needs, &band_order)?;
    Ok((assignments, needs, summary))
}
