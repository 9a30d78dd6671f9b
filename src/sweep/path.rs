//! Dotted paths into a TOML table (`router.router_params.policy`,
//! `workload.stages.0.workload_params.request_rate`): how a grid axis or an
//! override names the value it sets. A leaf helper: its callers give its
//! message the file and key it concerns.

/// Sets `path` (dotted; numeric segments index lists) in `table` to
/// `value`, creating missing tables on the way.
pub fn set_path(table: &mut toml::Table, path: &str, value: toml::Value) -> Result<(), String> {
    let segs: Vec<&str> = path.split('.').collect();
    if segs.iter().any(|s| s.is_empty()) {
        return Err("a path is dot-separated keys, such as router.router_params.policy".into());
    }
    let (first, rest) = segs.split_first().expect("split always yields one segment");
    missing_list(table, first, rest, first)?;
    let slot = table.entry(first.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
    set_in(slot, rest, value, first)
}

/// A path that indexes (`….0.…`) a list the spec does not have: it cannot
/// be made up (a stage needs its type), so it is an error naming the list.
fn missing_list(t: &toml::Table, seg: &str, tail: &[&str], here: &str) -> Result<(), String> {
    match tail.first() {
        Some(i) if !t.contains_key(seg) && i.parse::<usize>().is_ok() => Err(format!(
            "`{here}` is a list the spec does not have, so it has no entry {i}: write the list first \
             (e.g. [[{here}]] with its type), then vary its keys"
        )),
        _ => Ok(()),
    }
}

fn set_in(cur: &mut toml::Value, rest: &[&str], value: toml::Value, at: &str) -> Result<(), String> {
    let Some((seg, tail)) = rest.split_first() else {
        *cur = value;
        return Ok(());
    };
    let here = format!("{at}.{seg}");
    match cur {
        toml::Value::Table(t) => {
            missing_list(t, seg, tail, &here)?;
            let slot = t.entry(seg.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            set_in(slot, tail, value, &here)
        }
        toml::Value::Array(items) => {
            let len = items.len();
            let idx: usize =
                seg.parse().map_err(|_| format!("`{at}` is a list; `{seg}` must be an index (0, 1, …)"))?;
            let item =
                items.get_mut(idx).ok_or_else(|| format!("`{at}` has {len} entries; index {idx} is out of range"))?;
            set_in(item, tail, value, &here)
        }
        _ => Err(format!("`{at}` is a value, not a table")),
    }
}
