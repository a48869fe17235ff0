//! The report as a table (default), JSON or YAML.

use std::fmt::Write as _;

use super::Report;
use super::args::Output;

/// The report in `format`, ending with a newline.
pub(crate) fn render(report: &Report, format: Output) -> String {
    match format {
        Output::Json => {
            let mut text = serde_json::to_string_pretty(report).unwrap_or_default();
            text.push('\n');
            text
        }
        Output::Yaml => serde_saphyr::to_string(report).unwrap_or_default(),
        Output::Table => table(report),
    }
}

/// Columns padded to the widest cell, as kubectl prints.
fn columns(out: &mut String, title: &str, header: &[&str], rows: Vec<Vec<String>>) {
    let _ = writeln!(out, "\n{title} ({}):", rows.len());
    if rows.is_empty() {
        return;
    }
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut String, cells: Vec<&str>| {
        let last = cells.len() - 1;
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                let _ = writeln!(out, "  {cell}");
            } else {
                let _ = write!(out, "  {cell:<w$} ");
            }
        }
    };
    line(out, header.to_vec());
    for row in &rows {
        line(out, row.iter().map(String::as_str).collect());
    }
}

fn table(r: &Report) -> String {
    let mut out = String::new();
    let volumes = match (&r.volumes, &r.volumes_not_checked) {
        (Some(n), _) => format!("{n} volumes"),
        (None, Some(why)) => format!("volumes not checked: {why}"),
        (None, None) => "volumes not checked".to_owned(),
    };
    let _ = writeln!(out, "driver {}: {} PVs, {volumes}", r.driver, r.pvs);
    let dash = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".to_owned());
    columns(
        &mut out,
        "Leaked volumes (no PV)",
        &["VOLUME ID"],
        r.leaked.iter().map(|v| vec![v.clone()]).collect(),
    );
    if !r.unconfirmed.is_empty() {
        columns(
            &mut out,
            "Volumes without a PV that an open intent may explain (run again later)",
            &["VOLUME ID"],
            r.unconfirmed.iter().map(|v| vec![v.clone()]).collect(),
        );
    }
    columns(
        &mut out,
        "Lost volumes (PV without its volume)",
        &["PV", "VOLUME HANDLE", "CLAIM", "PHASE"],
        r.lost
            .iter()
            .map(|l| {
                vec![
                    l.pv.clone(),
                    l.volume_handle.clone(),
                    dash(&l.claim),
                    l.phase.clone(),
                ]
            })
            .collect(),
    );
    columns(
        &mut out,
        "Stuck PVs",
        &["PV", "STATE", "SINCE", "REASON"],
        r.stuck
            .iter()
            .map(|s| {
                let reason = match &s.last_warning {
                    Some(w) => format!("{}; last warning: {w}", s.reason),
                    None => s.reason.clone(),
                };
                vec![s.pv.clone(), s.state.to_owned(), s.since.clone(), reason]
            })
            .collect(),
    );
    columns(
        &mut out,
        "PVs without the deletion-protection finalizer",
        &["PV", "CLAIM"],
        r.missing_finalizer
            .iter()
            .map(|u| vec![u.pv.clone(), dash(&u.claim)])
            .collect(),
    );
    columns(
        &mut out,
        "Unresolved intents",
        &["VOLUME", "CLAIM", "VOLUME ID", "KEPT IN"],
        r.unresolved_intents
            .iter()
            .map(|i| {
                vec![
                    i.volume.clone(),
                    i.claim.clone(),
                    dash(&i.volume_id),
                    i.kept_in.to_owned(),
                ]
            })
            .collect(),
    );
    columns(
        &mut out,
        "Unused claims",
        &["CLAIM", "UNUSED SINCE", "FROM"],
        r.unused_claims
            .iter()
            .map(|u| vec![u.claim.clone(), u.since.clone(), u.from.to_owned()])
            .collect(),
    );
    if !r.deleted.is_empty() {
        columns(
            &mut out,
            "--delete-orphans",
            &["VOLUME ID", "OUTCOME"],
            r.deleted
                .iter()
                .map(|d| vec![d.volume_id.clone(), d.outcome.clone()])
                .collect(),
        );
    }
    out
}
