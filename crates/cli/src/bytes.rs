//! Byte sizes as flags and settings take them (`8GiB`, `512MiB`, `1.5GB`).

/// An optional byte-size setting (see [`parse_bytes`]).
pub(crate) fn byte_size(text: Option<String>) -> anyhow::Result<Option<u64>> {
    text.map(|t| parse_bytes(&t).map_err(anyhow::Error::msg)).transpose()
}

/// Parses a byte size: `1024`, `512MiB`, `8GiB`, `1.5GB`, `2T`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 = num.parse().map_err(|_| format!("{s:?} is not a size like 8GiB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024f64.powi(2),
        "mb" => 1e6,
        "g" | "gib" => 1024f64.powi(3),
        "gb" => 1e9,
        "t" | "tib" => 1024f64.powi(4),
        "tb" => 1e12,
        u => return Err(format!("unknown unit {u:?} in {s:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")),
    };
    Ok((x * mult) as u64)
}
