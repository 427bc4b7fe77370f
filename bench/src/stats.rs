//! One measured figure, in the same shape as the Node peers' results so both merge into one
//! table.

use serde::{Deserialize, Serialize};

/// A workload measured on one peer (corral counts as a peer too).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measurement {
    pub peer: String,
    pub workload: String,
    pub unit: String,
    /// Samples; 0 when the peer could not run the workload (`note` says why).
    pub n: usize,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Measurement {
    /// A workload the peer could not run.
    pub fn missing(peer: &str, workload: &str, unit: &str, why: &str) -> Self {
        Measurement {
            peer: peer.into(),
            workload: workload.into(),
            unit: unit.into(),
            n: 0,
            p50: None,
            p99: None,
            min: None,
            max: None,
            mean: None,
            note: Some(why.into()),
        }
    }
}

/// Nearest-rank percentiles over the samples (the peers' harness uses the same rule).
pub fn summarize(
    peer: &str,
    workload: &str,
    unit: &str,
    mut samples: Vec<f64>,
    note: &str,
) -> Measurement {
    if samples.is_empty() {
        return Measurement::missing(peer, workload, unit, "no samples");
    }
    samples.sort_by(f64::total_cmp);
    let rank = |p: f64| {
        let index = ((p / 100.0) * samples.len() as f64).ceil() as usize;
        samples[index.clamp(1, samples.len()) - 1]
    };
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    Measurement {
        peer: peer.into(),
        workload: workload.into(),
        unit: unit.into(),
        n: samples.len(),
        p50: Some(rank(50.0)),
        p99: Some(rank(99.0)),
        min: samples.first().copied(),
        max: samples.last().copied(),
        mean: Some(mean),
        note: Some(note.into()),
    }
}
